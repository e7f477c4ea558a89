"""Deleting every version of an object, and what a locked one says about itself.

On a versioned bucket a plain delete writes a delete marker and keeps the bytes, billed,
as a noncurrent version; on a bucket with Object Lock (always versioned) that is all a
delete can do to a retained or held object. A purge means the bytes are gone, so after
the plain delete the adapter lists what versions are left under the checkpoint and
deletes each by its id, unless the tier says `keep_versions: true` (the bucket's own
lifecycle expires them). An unversioned bucket lists none: one request per removal.

A version the provider refuses to delete (AccessDenied on a retained or held version)
raises ObjectLocked with the retain-until date or the legal hold, read from the version's
HeadObject, so the action fails at once with the date instead of retrying in a loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from app.domain.duration import format_instant
from app.storage import limits
from app.storage.base import ObjectLocked, PermissionDenied, StorageError, TransientError
from app.storage.retry import retrying
from app.storage.s3.errors import PERMISSION_CODES, TRANSIENT_CODES, call_translated, error_code

if TYPE_CHECKING:
    from app.storage.s3.calls import S3Calls

# What stores without versions (rclone's serve s3, some appliances) answer to
# ListObjectVersions: nothing can be left behind there.
UNSUPPORTED = frozenset({"NotImplemented", "MethodNotAllowed", "InvalidRequest"})

Version = tuple[str, str]  # (object key, version id)
MISSING = ("NoSuchKey", "NoSuchVersion")  # already gone: deleted


def leftover_versions(calls: S3Calls, prefix: str) -> Iterator[Version]:
    """Every version and delete marker under `prefix` (object keys), page by page."""
    args: dict[str, Any] = {"Bucket": calls.bucket, "Prefix": prefix}
    what = f"ListObjectVersions {calls._url(prefix)}"

    def call() -> dict[str, Any] | None:
        try:
            return dict(calls.client.list_object_versions(**args))
        except ClientError as error:
            if error_code(error) in UNSUPPORTED:
                return None
            raise

    while page := calls._request(what, call):
        for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
            key, version = entry.get("Key"), entry.get("VersionId")
            if key is None or version is None:
                continue
            yield key, version
        if not page.get("IsTruncated"):
            return
        args["KeyMarker"] = page.get("NextKeyMarker", "")
        args["VersionIdMarker"] = page.get("NextVersionIdMarker", "")


def delete_versions(calls: S3Calls, versions: Iterator[Version]) -> int:
    """Delete each (key, version) for good, a DeleteObjects of up to 1,000 at a time."""
    deleted = 0
    for batch in limits.batched(versions, limits.S3_MAX_DELETE_KEYS):
        deleted += delete_batch(calls, batch)
    return deleted


def delete_batch(calls: S3Calls, batch: list[Version] | list[str]) -> int:
    """One DeleteObjects of object keys, or of (key, version id) pairs; a retry sends only
    the entries the previous answer reported. Missing ones count as deleted; a refusal is
    ObjectLocked when a lock explains it (versions only: a plain delete of a locked object
    just writes a delete marker)."""
    kind = "versions" if batch and isinstance(batch[0], tuple) else "keys"
    what = f"DeleteObjects of {len(batch)} {kind} under {calls._url(calls.prefix)}"
    remaining: list[Any] = list(batch)

    def entry(item: Any) -> Any:  # an ObjectIdentifier
        return {"Key": item[0], "VersionId": item[1]} if isinstance(item, tuple) else {"Key": item}

    def key_of(item: Any) -> str:
        return str(item[0] if isinstance(item, tuple) else item)

    def call() -> None:
        nonlocal remaining
        response = call_translated(
            what,
            partial(
                calls.client.delete_objects,
                Bucket=calls.bucket,
                Delete={"Objects": [entry(item) for item in remaining], "Quiet": True},
            ),
        )
        errors = [
            e
            for e in response.get("Errors", [])
            if e.get("Code") not in ("NoSuchKey", "NoSuchVersion")
        ]
        if not errors:
            return
        failed = {str(e.get("Key")) for e in errors}
        remaining = [item for item in remaining if key_of(item) in failed] or remaining
        codes = sorted({str(e.get("Code")) for e in errors})
        first = errors[0]
        text = (
            f"{what}: {len(errors)} {kind} not deleted ({', '.join(codes)}), "
            f"e.g. {first.get('Key')}: {first.get('Message', '')}"
        )
        if all(code in TRANSIENT_CODES for code in codes):
            raise TransientError(text)
        if any(code in PERMISSION_CODES for code in codes):
            if kind == "versions":
                raise locked_or_denied(calls, remaining, text)
            raise PermissionDenied(text)  # a locked or held object among them
        raise StorageError(text)

    retrying(call, what=what)
    return len(batch)


def locked_or_denied(calls: S3Calls, versions: list[Version], text: str) -> PermissionDenied:
    """ObjectLocked naming the first refused version's lock (the latest retain-until date
    among them, or its legal hold); a plain PermissionDenied when none is locked."""
    latest: datetime | None = None
    held: str | None = None
    for key, version in versions:
        head = _version_head(calls, key, version)
        if head is None:
            continue
        if head.get("ObjectLockLegalHoldStatus") == "ON" and held is None:
            held = key
        until = head.get("ObjectLockRetainUntilDate")
        if isinstance(until, datetime) and until > datetime.now(UTC):
            latest = until if latest is None or until > latest else latest
    if held is not None:
        where = calls._url(held)
        return ObjectLocked(
            f"{text}: {where} is under a legal hold", retain_until=latest, legal_hold=True
        )
    if latest is not None:
        return ObjectLocked(
            f"{text}: retained by Object Lock until {format_instant(latest)}",
            retain_until=latest.astimezone(UTC),
            legal_hold=False,
        )
    return PermissionDenied(text)


def _version_head(calls: S3Calls, key: str, version: str) -> dict[str, Any] | None:
    what = f"HeadObject {calls._url(key)} version {version}"
    try:
        return dict(
            calls._request(
                what,
                partial(calls.client.head_object, Bucket=calls.bucket, Key=key, VersionId=version),
            )
        )
    except StorageError:
        return None  # a delete marker, or a version gone since: it says nothing of a lock


def remove_leftovers(calls: S3Calls, prefix: str, keys: set[str] | None = None) -> int:
    """After the plain deletes under `prefix` (object keys; only `keys` among them when
    given), delete every version and delete marker left there."""
    found = leftover_versions(calls, prefix)
    return delete_versions(calls, (v for v in found if keys is None or v[0] in keys))


def refuse_if_locked(calls: S3Calls, prefix: str, keys: set[str] | None = None) -> None:
    """Before anything under `prefix` is deleted on a tier whose bucket locks objects: one
    HeadObject per version, and ObjectLocked if any is retained or held, so that a purge
    is whole or nothing."""
    versions = [v for v in leftover_versions(calls, prefix) if keys is None or v[0] in keys]
    heads = calls._in_parallel(partial(_version_head, calls, k, v) for k, v in versions)
    now = datetime.now(UTC)
    for head in heads:
        if head is None:
            continue
        until = head.get("ObjectLockRetainUntilDate")
        if head.get("ObjectLockLegalHoldStatus") == "ON" or (
            isinstance(until, datetime) and until > now
        ):
            raise locked_or_denied(
                calls, versions, f"refusing to delete under {calls._url(prefix)}"
            )
