"""What a tier's bucket does beyond storing objects, as the provider bills and refuses it:
soft delete, versions, object lock, Autoclass. Pure data, no I/O.

moto and fake-gcs-server delete at once and never refuse; a real bucket may keep deleted
bytes (and bill them) for days, keep every old version until a lifecycle rule expires it,
refuse a delete under retention, or ignore a storage class. The cost reports, the plan
and the mover read these settings to give the answer the provider will."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

LockMode = Literal["GOVERNANCE", "COMPLIANCE"]
SettingsSource = Literal["default", "tiers file", "bucket"]


@dataclass(frozen=True, slots=True)
class ObjectLock:
    """Placements the service makes on the tier are written locked this long."""

    mode: LockMode
    retain: timedelta


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """One tier's bucket behaviour; the defaults are a plain bucket that forgets at once.

    `source` says where the figures came from: the tiers file, the bucket's own
    configuration read at start, or neither (the defaults)."""

    soft_delete: timedelta | None = None  # GCS soft delete retention
    versioned: bool = False
    keep_versions: bool = False  # a purge leaves delete markers; old versions stay (billed)
    noncurrent_expiry: timedelta | None = None  # the bucket's lifecycle removes them then
    object_lock: ObjectLock | None = None
    autoclass: bool = False
    source: SettingsSource = "default"

    @property
    def removes_versions(self) -> bool:
        """Whether a delete the service makes removes every version of an object."""
        return self.versioned and not self.keep_versions

    @property
    def billed_after_delete(self) -> timedelta | None:
        """How long the provider keeps billing a deleted object's bytes: zero for a plain
        bucket, None for ever (noncurrent versions that nothing expires)."""
        kept = timedelta(0)
        if self.soft_delete is not None:
            kept = max(kept, self.soft_delete)
        if self.versioned and self.keep_versions:
            if self.noncurrent_expiry is None:
                return None
            kept = max(kept, self.noncurrent_expiry)
        return kept

    @property
    def billed_forever(self) -> bool:
        return self.billed_after_delete is None


def autoclass_refusal(storage_class: str) -> str:
    return (
        f"storage_class {storage_class!r} cannot hold on an Autoclass bucket: Autoclass "
        "moves objects between classes by itself and ignores the class a rewrite asks for; "
        "leave storage_class out, or turn Autoclass off on the bucket"
    )
