"""The storage vocabulary shared by every adapter (local directories, S3, GCS).

Keys are '/'-separated and relative to the tier's url, so one checkpoint's files are
`<prefix>/<path>` whatever the provider. Every operation is safe to repeat: deleting a
missing object succeeds, writing an object again replaces it whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, BinaryIO, Literal, NamedTuple, Protocol

# Checksum names comparable with a manifest ("sha256" hex, "crc32c" 8 and "crc64nvme" 16 hex
# digits, each of the whole object) and provider fingerprints comparable between two objects
# of one provider ("md5", "etag").
MANIFEST_CHECKSUMS = ("sha256", "crc32c", "crc64nvme")

RestoreState = Literal["readable", "archived", "restoring"]
NO_CHECKSUMS: Mapping[str, str] = MappingProxyType({})  # shared, and nobody's to fill


class StorageError(Exception):
    """A storage operation failed; `retryable` says whether trying again may help."""

    retryable = False


class TransientError(StorageError):
    """Throttling, a 5xx, a timeout or a reset connection: worth another try later."""

    retryable = True


class PermanentError(StorageError):
    """Trying again will not help (a missing object, a refused permission, an object lock,
    an unsafe path): an action meeting one fails at once, with the reason."""


class ObjectMissing(PermanentError):
    """The object or prefix does not exist."""


class UnsafePath(PermanentError):
    """A path under a tier leads outside it (a symlink, say)."""


class PermissionDenied(PermanentError):
    """The provider refused the request: missing rights, a retention policy, an object
    lock or legal hold."""


class ObjectLocked(PermissionDenied):
    """The provider keeps the object: Object Lock retention until `retain_until`, or a
    legal hold (no date: it lasts until someone lifts it). Waiting for the date heals it,
    retrying before does not."""

    def __init__(self, message: str, *, retain_until: datetime | None, legal_hold: bool) -> None:
        super().__init__(message)
        self.retain_until = retain_until
        self.legal_hold = legal_hold


class ArchivedObject(StorageError):
    """The object sits in an archive class and must be restored before it can be read."""


class ObjectInfo(NamedTuple):
    """What a listing or a HEAD says of one object. A tuple: an import lists millions."""

    key: str  # relative to the listed prefix (list_prefix) or the tier (head), '/' separated
    size_bytes: int
    storage_class: str | None = None
    checksums: Mapping[str, str] = NO_CHECKSUMS
    modified: datetime | None = None  # last written, where a listing tells (reconciliation)


def file_entry(path: str, info: ObjectInfo) -> dict[str, Any]:
    """A manifest entry of the object: its path in the checkpoint, its size, and the
    full-object checksums its provider reported."""
    if not info.checksums:  # a directory's files (an import's million of them)
        return {"path": path, "size_bytes": info.size_bytes}
    return {
        "path": path,
        "size_bytes": info.size_bytes,
        **{n: info.checksums[n] for n in MANIFEST_CHECKSUMS if n in info.checksums},
    }


class Storage(Protocol):
    """One tier's objects. Implementations: LocalStorage, S3Storage, GcsStorage."""

    scheme: str  # "file", "s3" or "gs"

    def same_service(self, other: Storage) -> bool:
        """Whether `copy_within(other, ...)` can copy server-side from `other` to here."""
        ...

    # -- reading ---------------------------------------------------------------------------

    def list_prefix(self, prefix: str, *, checksums: bool = False) -> list[ObjectInfo]:
        """Every object under `prefix/`, keys relative to it, sorted by key. Raises
        ObjectMissing when there is none, UnsafePath when one leads outside the tier.

        With `checksums` (a registration's manifest), each object's full-object checksums
        are there too where the provider keeps any, even if its listing leaves them out (S3:
        one HeadObject for each object its listing says has one); without, only what the
        listing itself carries, at the cost of the listing alone (a whole tier's scan)."""
        ...

    def iter_prefix(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object under `prefix/` (the whole tier for ""), keys relative to it, in
        key order, as the provider lists them: a page at a time, so a tree of millions of
        objects streams in bounded memory (an import). `start_after` (relative) resumes
        a listing after that key. A missing prefix yields nothing."""
        ...

    def prefix_exists(self, prefix: str) -> bool: ...

    def head(self, key: str) -> ObjectInfo | None:
        """Size, class and known checksums of one object; None when it does not exist."""
        ...

    def open_read(self, key: str) -> BinaryIO:
        """A stream of the object's bytes. Raises ArchivedObject when it must be restored
        first, ObjectMissing when it does not exist."""
        ...

    def read_small(self, key: str, limit: int) -> bytes:
        """The whole of a small object (a Trainer's state), in one request where the
        provider allows. Raises PermanentError when it holds more than `limit` bytes,
        ObjectMissing when it does not exist."""
        ...

    # -- writing ---------------------------------------------------------------------------

    def upload(
        self, key: str, reader: BinaryIO, size: int, *, storage_class: str | None = None
    ) -> None:
        """Write `size` bytes read from `reader`, in bounded memory (multipart above a part)."""
        ...

    def copy_within(
        self,
        source: Storage,
        source_key: str,
        key: str,
        size: int,
        *,
        storage_class: str | None = None,
    ) -> None:
        """Server-side copy from `source` (where `same_service(source)`); no bytes pass
        through this process."""
        ...

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Change one object's class in place, server-side."""
        ...

    def delete_keys(self, keys: Iterable[str]) -> int:
        """Delete objects in provider-sized batches; missing ones count as deleted."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete everything under `prefix/`; a missing prefix is success. Refuses the root."""
        ...

    def abort_uploads(self, prefix: str) -> int:
        """Abort unfinished multipart uploads under `prefix/` (a crashed transfer's)."""
        ...

    # -- archive classes -------------------------------------------------------------------

    def restore_state(self, key: str) -> RestoreState: ...

    def request_restore(self, key: str, *, days: int = 1) -> None:
        """Ask for an archived object to become readable; repeating it is harmless."""
        ...


# Local failures that waiting does not heal (a full disk may: someone frees space).
_PERMANENT_OS_ERRORS = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def is_permanent(error: BaseException) -> bool:
    """Whether an action meeting `error` should fail now rather than be tried again."""
    if isinstance(error, StorageError):
        return isinstance(error, PermanentError)
    return isinstance(error, _PERMANENT_OS_ERRORS)


def read_whole(reader: BinaryIO, limit: int, what: str) -> bytes:
    """`read_small` from a stream: at most `limit` bytes, refused beyond."""
    with reader:
        data = reader.read(limit + 1)
    if len(data) > limit:
        raise PermanentError(f"{what}: more than the {limit} bytes read whole")
    return data


def join_key(prefix: str, relative: str) -> str:
    return f"{prefix}/{relative}" if prefix else relative
