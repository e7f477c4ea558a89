"""Google Cloud Storage tiers.

Every provider call goes through `GcsStorage._call`, which turns the library's errors into
the storage vocabulary and retries transient ones with `retrying`; the library's own
retries are switched off (`retry=None`) so a call is never retried twice over.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, TypeVar

from google.api_core import exceptions as api
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption

from app.domain.provider import ProviderSettings
from app.storage.base import (
    ObjectInfo,
    ObjectMissing,
    PermissionDenied,
    RestoreState,
    Storage,
    StorageError,
    TransientError,
    UnsafePath,
    join_key,
    read_whole,
)
from app.storage.gcs import generations
from app.storage.gcs.client import shared_client
from app.storage.gcs.errors import PROVIDER_ERRORS, BatchUnsupported, translate
from app.storage.limits import GCS_MAX_BATCH_CALLS, MiB, batched
from app.storage.retry import ATTEMPTS, in_this_context, retrying
from app.storage.streams import BoundedReader, ObjectReader, is_seekable, read_up_to

T = TypeVar("T")
log = logging.getLogger("app.storage")

RESUMABLE_ALIGNMENT = 256 * 1024  # GCS rejects resumable chunks of other multiples
SINGLE_REQUEST_MAX = 8 * MiB  # the library's own limit for a one-request upload


def _hex(b64: str | None) -> str | None:
    return base64.b64decode(b64).hex() if b64 else None


def _checksums(blob: storage.Blob) -> dict[str, str]:
    found = {"crc32c": _hex(blob.crc32c), "md5": _hex(blob.md5_hash)}
    return {name: value for name, value in found.items() if value}


def _is_folder_marker(relative: str, size: int) -> bool:
    """The console's "folders" are empty objects named like `dir/`: not files of a checkpoint."""
    return size == 0 and (relative == "" or relative.endswith("/"))


_LIST_FIELDS = "items(name,size,storageClass,crc32c,md5Hash,updated),nextPageToken"
LIST_PAGE = 1000


def _info(blob: storage.Blob, start: str, prefix: str) -> ObjectInfo:
    return ObjectInfo(
        key=_safe_relative(blob.name[len(start) :], prefix),
        size_bytes=int(blob.size),
        storage_class=blob.storage_class,
        checksums=_checksums(blob),
        modified=blob.updated,
    )


def _safe_relative(key: str, prefix: str) -> str:
    """Object names are flat strings; refuse ones that would climb out of a directory
    when the checkpoint is written to a filesystem tier."""
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise UnsafePath(f"object {key!r} under {prefix!r} has an empty, '.' or '..' segment")
    return key


class GcsStorage:
    """One tier under `gs://bucket/prefix`; key `k` is the object `prefix/k`. Requests go
    through `client` when given (a StorageRegistry's), else the process's shared_client()."""

    scheme = "gs"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        chunk_size: int = 16 * MiB,
        concurrency: int = 8,
        client: storage.Client | None = None,
        provider: ProviderSettings | None = None,
    ) -> None:
        if chunk_size <= 0 or chunk_size % RESUMABLE_ALIGNMENT:
            raise ValueError(f"chunk_size must be a positive multiple of 256 KiB: {chunk_size}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1: {concurrency}")
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.chunk_size = chunk_size
        self.concurrency = concurrency
        self.provider = provider or ProviderSettings()
        self._client = client if client is not None else shared_client()
        self._bucket = self._client.bucket(bucket)
        # Cleared the first time the endpoint mangles a batch (fake-gcs-server does).
        self._batch_deletes = True

    def __repr__(self) -> str:
        return f"GcsStorage({self._url(self.prefix)!r})"

    # -- plumbing ------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _dir(self, prefix: str) -> str:
        """The object-name prefix of everything under `prefix/` ("" for the tier root)."""
        relative = prefix.strip("/")
        name = self._name(relative) if relative else self.prefix
        return f"{name}/" if name else ""

    def _url(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{name}"

    def _call(self, what: str, call: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
        def attempt() -> T:
            try:
                return call()
            except PROVIDER_ERRORS as error:
                raise translate(error, what) from error

        return retrying(attempt, what=what, attempts=attempts)

    def _get(self, name: str) -> storage.Blob | None:
        return self._call(
            f"head {self._url(name)}", lambda: self._bucket.get_blob(name, retry=None)
        )

    def _list(self, prefix: str, fields: str) -> list[storage.Blob]:
        """A whole listing as one retried call: a page failing restarts it, which is cheap
        next to what a checkpoint listing feeds."""
        start = self._dir(prefix)
        return self._call(
            f"list {self._url(start)}",
            lambda: list(
                self._client.list_blobs(self._bucket, prefix=start, fields=fields, retry=None)
            ),
        )

    # -- reading -------------------------------------------------------------------------------

    def same_service(self, other: Storage) -> bool:
        return isinstance(other, GcsStorage)  # rewrite copies between any two buckets

    def list_prefix(self, prefix: str, *, checksums: bool = False) -> list[ObjectInfo]:
        """GCS lists every object's crc32c (of the whole object, composed ones included):
        `checksums` costs nothing more."""
        start = self._dir(prefix)
        blobs = self._list(prefix, _LIST_FIELDS)
        found = [
            _info(blob, start, prefix)
            for blob in blobs
            if not _is_folder_marker(blob.name[len(start) :], int(blob.size))
        ]
        if not found:
            raise ObjectMissing(f"nothing under {self._url(start)}")
        found.sort(key=lambda info: info.key)
        return found

    def iter_prefix(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """A page per call, each retried on its own: the next one starts at the last name
        seen (`start_offset` is inclusive, so that name is skipped)."""
        start = self._dir(prefix)
        last = start + start_after if start_after else None
        while True:
            offset = last

            def page(offset: str | None = offset) -> list[storage.Blob]:
                return list(
                    self._client.list_blobs(
                        self._bucket,
                        prefix=start,
                        start_offset=offset,
                        max_results=LIST_PAGE,
                        fields=_LIST_FIELDS,
                        retry=None,
                    )
                )

            blobs = [b for b in self._call(f"list {self._url(start)}", page) if b.name != last]
            for blob in blobs:
                if not _is_folder_marker(blob.name[len(start) :], int(blob.size)):
                    yield _info(blob, start, prefix)
            if not blobs:
                return
            last = blobs[-1].name

    def prefix_exists(self, prefix: str) -> bool:
        start = self._dir(prefix)

        def probe() -> bool:
            page = self._client.list_blobs(
                self._bucket, prefix=start, max_results=1, fields="items(name)", retry=None
            )
            return any(True for _ in page)

        return self._call(f"list {self._url(start)}", probe)

    def head(self, key: str) -> ObjectInfo | None:
        blob = self._get(self._name(key))
        if blob is None:
            return None
        return ObjectInfo(
            key=key,
            size_bytes=int(blob.size),
            storage_class=blob.storage_class,
            checksums=_checksums(blob),
        )

    def read_small(self, key: str, limit: int) -> bytes:
        return read_whole(self.open_read(key), limit, f"read {self._url(self._name(key))}")

    def open_read(self, key: str) -> BinaryIO:
        name = self._name(key)
        blob = self._get(name)
        if blob is None:
            raise ObjectMissing(f"{self._url(name)} does not exist")
        what = f"read {self._url(name)}"

        def fetch(offset: int, count: int | None) -> bytes:
            end = None if count is None else offset + count - 1
            data: bytes = self._call(
                what,
                lambda: blob.download_as_bytes(
                    start=offset, end=end, raw_download=True, checksum=None, retry=None
                ),
            )
            return data

        # One generation, the one the metadata GET saw, fetched a range at a time and
        # checked against its stored crc32c once read to the end.
        raw = ObjectReader(
            fetch, what, size=int(blob.size), chunk_size=self.chunk_size, crc32c=_hex(blob.crc32c)
        )
        return io.BufferedReader(raw, buffer_size=self.chunk_size)

    # -- writing -------------------------------------------------------------------------------

    def upload(
        self, key: str, reader: BinaryIO, size: int, *, storage_class: str | None = None
    ) -> None:
        """Up to 8 MiB the library sends one request (buffering at most that much); above it
        a resumable upload in `chunk_size` pieces. The server checks the crc32c either way.
        A failed attempt starts again from the reader's first position. A reader that
        cannot seek (a stream from another provider) is read into memory first when it fits
        in one request, so it gets every attempt too; a larger one gets one attempt (the
        action as a whole is retried)."""
        name = self._name(key)
        url = self._url(name)
        start = reader.tell() if is_seekable(reader) else None
        if start is None and size <= SINGLE_REQUEST_MAX:
            reader, start = io.BytesIO(read_up_to(reader, size)), 0

        def attempt() -> None:
            if start is not None:
                reader.seek(start)
            # A chunk size makes the library go resumable whatever the size; small objects
            # go in one request (one round trip, and emulators keep their class).
            chunked = self.chunk_size if size > SINGLE_REQUEST_MAX else None
            blob = self._bucket.blob(name, chunk_size=chunked)
            if storage_class:
                blob.storage_class = storage_class
            try:
                blob.upload_from_file(
                    BoundedReader(reader, size, f"upload {url}"),
                    size=size,
                    content_type="application/octet-stream",
                    checksum="crc32c",
                    retry=None,
                )
            except DataCorruption:
                self._discard(name)  # written whole but wrong: don't leave it looking done
                raise
            if blob.size is not None and int(blob.size) != size:
                self._discard(name)
                raise StorageError(f"upload {url}: reader gave {blob.size} of {size} bytes")

        self._call(f"upload {url}", attempt, attempts=ATTEMPTS if start is not None else 1)

    def _discard(self, name: str) -> None:
        try:
            self._delete_one(name)
        except StorageError as error:
            log.warning(
                "could not remove a bad upload",
                extra={"object": self._url(name), "error": str(error)},
            )

    def _rewrite(self, source: storage.Blob, dest: storage.Blob, what: str) -> None:
        """Rewrite returns a token until the server has copied everything; real GCS may need
        many calls across locations or classes, each one retried on its own."""

        def step(token: str | None) -> str | None:
            next_token, _done, _total = dest.rewrite(source, token=token, retry=None)
            return next_token if isinstance(next_token, str) else None

        token = self._call(what, lambda: step(None))
        while token is not None:
            token = self._call(what, functools.partial(step, token))

    def copy_within(
        self,
        source: Storage,
        source_key: str,
        key: str,
        size: int,
        *,
        storage_class: str | None = None,
    ) -> None:
        """GCS rewrites objects of any size server-side, so `size` needs no planning here."""
        if not isinstance(source, GcsStorage):
            raise StorageError(f"cannot copy server-side into {self!r} from {source!r}")
        source_name = source._name(source_key)
        name = self._name(key)
        dest = self._bucket.blob(name)
        if storage_class:
            dest.storage_class = storage_class
        self._rewrite(
            source._bucket.blob(source_name),
            dest,
            f"copy {source._url(source_name)} to {self._url(name)}",
        )

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """A rewrite onto itself, skipped when the class is already right (it is billed)."""
        name = self._name(key)
        blob = self._get(name)
        if blob is None:
            raise ObjectMissing(f"{self._url(name)} does not exist")
        if blob.storage_class == storage_class:
            return
        dest = self._bucket.blob(name)
        dest.storage_class = storage_class
        self._rewrite(blob, dest, f"set class {storage_class} on {self._url(name)}")

    def delete_keys(self, keys: Iterable[str]) -> int:
        """JSON batch requests of up to 100 deletes. fake-gcs-server answers the Python
        client's batches with an empty multipart reply (it skips parts without a Content-ID,
        which this client never sends) and deletes nothing, so when a batch reply does not
        hold one answer per call this instance switches to parallel single deletes."""
        deleted = 0
        sweep = self.provider.removes_versions
        swept: set[str] = set()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="gcs-delete") as pool:
            for chunk in batched(keys, GCS_MAX_BATCH_CALLS):
                names = [self._name(key) for key in chunk]
                if self._batch_deletes:
                    try:
                        self._delete_batch(names)
                        deleted += len(names)
                        swept.update(names if sweep else ())
                        continue
                    except BatchUnsupported as error:
                        self._batch_deletes = False
                        log.warning(
                            "GCS endpoint mishandles batch requests; deleting one by one",
                            extra={"bucket": self.bucket_name, "error": str(error)},
                        )
                for _ in pool.map(in_this_context(self._delete_one), names):
                    pass
                deleted += len(names)
                swept.update(names if sweep else ())
        if swept:  # a versioned bucket: the noncurrent generations go too
            common = os.path.commonprefix(sorted(swept))  # noqa: RUF071 (a name prefix)
            generations.remove_generations(self, common, swept)
        return deleted

    def _delete_one(self, name: str) -> None:
        def delete() -> None:
            with contextlib.suppress(api.NotFound):  # already gone: deleting is idempotent
                self._bucket.delete_blob(name, retry=None)

        self._call(f"delete {self._url(name)}", delete)

    def _delete_batch(self, names: list[str]) -> None:
        """One batch request; calls answered 429/5xx are sent again in the next attempt."""
        pending = names

        def attempt() -> None:
            nonlocal pending
            batch = self._client.batch(raise_exception=False)
            try:
                with batch:
                    for name in pending:
                        self._bucket.delete_blob(name, retry=None)
            except (ValueError, api.NotFound, api.MethodNotAllowed) as error:
                raise BatchUnsupported(f"{type(error).__name__}: {error}") from error
            # finish() keeps each call's reply here when raise_exception is False.
            replies = batch._responses
            if len(replies) != len(pending):
                raise BatchUnsupported(f"{len(replies)} replies to {len(pending)} calls")
            again: list[str] = []
            for name, reply in zip(pending, replies, strict=True):
                status = int(reply.status_code)
                if 200 <= status < 300 or status == 404:
                    continue
                if status == 429 or status >= 500:
                    again.append(name)
                    continue
                text = f"delete {self._url(name)}: HTTP {status}: {reply.text[:200]}"
                raise PermissionDenied(text) if status == 403 else StorageError(text)
            pending = again
            if pending:
                raise TransientError(
                    f"batch delete in gs://{self.bucket_name}: {len(pending)} calls throttled "
                    "or failed server-side"
                )

        self._call(f"batch delete in gs://{self.bucket_name}", attempt)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.strip("/"):
            raise UnsafePath("refusing to delete a tier's root")
        names = [blob.name for blob in self._list(prefix, "items(name),nextPageToken")]
        root = self._dir("")
        return self.delete_keys(name[len(root) :] for name in names)

    def abort_uploads(self, prefix: str) -> int:
        """Unfinished resumable uploads are sessions, not objects: nothing can list them and
        GCS drops them after a week, so there is nothing to abort."""
        return 0

    # -- archive classes -----------------------------------------------------------------------

    def restore_state(self, key: str) -> RestoreState:
        """Every GCS class, ARCHIVE included, is read directly (at a retrieval fee)."""
        return "readable"

    def request_restore(self, key: str, *, days: int = 1) -> None:
        return None
