"""A tier's bucket configuration read at start (`detect: true` in the tiers file): what
it keeps after a delete, whether it versions, locks or runs Autoclass.

The tiers file may state the same figures; a figure it states wins, and what it leaves
out is filled from the bucket. Reading needs rights a service account often lacks
(s3:GetBucketVersioning, s3:GetBucketObjectLockConfiguration, storage.buckets.get): when
refused, the stated figures stand and start-up logs a warning naming the tier."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from app.domain.provider import ObjectLock, ProviderSettings, autoclass_refusal
from app.domain.tier import Tier
from app.storage.base import Storage

log = logging.getLogger("app.storage")

DAY = timedelta(days=1)


class BucketSettingsError(Exception):
    """A tier's bucket contradicts its settings (Autoclass with a storage class)."""


def s3_settings(versioning: Mapping[str, Any], lock: Mapping[str, Any] | None) -> dict[str, Any]:
    """Figures from GetBucketVersioning and GetObjectLockConfiguration answers (None when
    the bucket has no lock configuration)."""
    found: dict[str, Any] = {"versioned": versioning.get("Status") in ("Enabled", "Suspended")}
    config = (lock or {}).get("ObjectLockConfiguration", {})
    if config.get("ObjectLockEnabled") == "Enabled":
        found["versioned"] = True
        retention = config.get("Rule", {}).get("DefaultRetention", {})
        days = retention.get("Days") or 365 * int(retention.get("Years") or 0)
        if retention.get("Mode") in ("GOVERNANCE", "COMPLIANCE") and days:
            found["object_lock"] = ObjectLock(retention["Mode"], timedelta(days=int(days)))
    return found


def gcs_settings(resource: Mapping[str, Any]) -> dict[str, Any]:
    """Figures from a GCS bucket resource (the JSON API's `buckets.get` answer)."""
    found: dict[str, Any] = {
        "versioned": bool(resource.get("versioning", {}).get("enabled")),
        "autoclass": bool(resource.get("autoclass", {}).get("enabled")),
    }
    seconds = resource.get("softDeletePolicy", {}).get("retentionDurationSeconds")
    if seconds is not None and int(seconds) > 0:
        found["soft_delete"] = timedelta(seconds=int(seconds))
    return found


def merged(tier: Tier, found: Mapping[str, Any]) -> Tier:
    """The tier with the bucket's figures where the tiers file stated none."""
    stated = tier.provider
    defaults = ProviderSettings()
    changes = {
        name: value
        for name, value in found.items()
        if getattr(stated, name) == getattr(defaults, name)
    }
    provider = dataclasses.replace(stated, **changes, source="bucket")
    if provider.autoclass and tier.storage_class is not None:
        raise BucketSettingsError(
            f"tier {tier.name!r}: its bucket runs Autoclass: "
            + autoclass_refusal(tier.storage_class)
        )
    return dataclasses.replace(tier, provider=provider)


def read_bucket(tier: Tier, storage: Storage) -> dict[str, Any] | None:
    """The bucket's figures, or None when the provider refuses to tell (logged)."""
    try:
        if tier.parsed.scheme == "s3":
            return _read_s3(storage)
        return _read_gcs(storage)
    except Exception as error:  # any refusal or failure: the stated figures stand
        log.warning(
            "cannot read the bucket's settings; the tiers file's stand",
            extra={"tier": tier.name, "error": f"{type(error).__name__}: {error}"},
        )
        return None


def _read_s3(storage: Storage) -> dict[str, Any]:
    from botocore.exceptions import ClientError

    from app.storage.s3 import S3Storage
    from app.storage.s3.errors import error_code

    assert isinstance(storage, S3Storage)
    versioning = storage.client.get_bucket_versioning(Bucket=storage.bucket)
    try:
        lock: Any = storage.client.get_object_lock_configuration(Bucket=storage.bucket)
    except ClientError as error:
        if error_code(error) != "ObjectLockConfigurationNotFoundError":
            raise
        lock = None
    return s3_settings(dict(versioning), lock)


def _read_gcs(storage: Storage) -> dict[str, Any]:
    from app.storage.gcs import GcsStorage

    assert isinstance(storage, GcsStorage)
    bucket = storage._client.get_bucket(storage.bucket_name)
    return gcs_settings(bucket._properties)


def detect_all(tiers: list[Tier], storage_for: Any) -> list[Tier]:
    """Every tier, those with `detect` read from their bucket; warns about old versions
    that nothing will ever remove (they stay billed)."""
    out: list[Tier] = []
    for tier in tiers:
        if tier.detect:
            found = read_bucket(tier, storage_for(tier))
            if found is not None:
                tier = merged(tier, found)
        if tier.provider.billed_forever:
            log.warning(
                "tier keeps old versions and nothing expires them: deleted checkpoints stay "
                "billed until someone removes them (set noncurrent_expiry to the bucket's "
                "lifecycle rule)",
                extra={"tier": tier.name},
            )
        out.append(tier)
    return out
