"""S3 and S3-compatible tiers: `S3Storage`, the Storage protocol over S3's requests
(calls.py) and multipart transfers (multipart.py)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, BinaryIO

from botocore.exceptions import ClientError

from app.domain.provider import ProviderSettings
from app.storage import limits
from app.storage.base import (
    ObjectInfo,
    ObjectMissing,
    RestoreState,
    Storage,
    StorageError,
    UnsafePath,
)
from app.storage.limits import MiB
from app.storage.retry import in_this_context
from app.storage.s3 import listing, versions
from app.storage.s3.checksums import head_checksums, with_checksums, write_args
from app.storage.s3.client import (
    DEFAULT_CONCURRENCY,
    checksum_mode,
    client_config,
    new_client,
    normal_endpoint,
)
from app.storage.s3.errors import call_translated, error_code
from app.storage.s3.multipart import S3Multipart
from app.storage.s3.small_reads import SmallReads
from app.storage.streams import BoundedReader, ObjectReader, is_seekable

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ListMultipartUploadsOutputTypeDef, RestoreRequestTypeDef

ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
DEFAULT_CLASS = "STANDARD"
# an empty, "." or ".." segment of a key: one search per listed object, not a split
_UNSAFE_SEGMENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
READ_BUFFER = 1 * MiB
SINGLE_PUT_MAX = 200 * MiB  # a seekable source up to this goes in one streamed PutObject


class S3Storage(S3Multipart):
    """One tier: `bucket` with keys under `prefix`, at `endpoint_url` (None: AWS).

    `client` is an already built client (a StorageRegistry's); without one the adapter
    builds its own from client.client_config, which a given one should match: botocore
    retrying nothing, request_checksums, a connection per request in flight."""

    scheme = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        request_checksums: str = "when_supported",
        part_size: int = 16 * MiB,
        max_single_copy: int = limits.S3_MAX_SINGLE_COPY,
        single_put_max: int = SINGLE_PUT_MAX,
        concurrency: int = DEFAULT_CONCURRENCY,
        client: S3Client | None = None,
        provider: ProviderSettings | None = None,
    ) -> None:
        checksums = checksum_mode(request_checksums)
        if not limits.S3_MIN_PART <= part_size <= limits.S3_MAX_SINGLE_PUT:
            raise ValueError(f"part_size {part_size} is outside S3's part size limits")
        if not 0 < max_single_copy <= limits.S3_MAX_SINGLE_COPY:
            raise ValueError(f"max_single_copy {max_single_copy} is outside (0, 5 GiB]")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = normal_endpoint(endpoint_url)
        self.request_checksums = checksums
        self.part_size = part_size
        self.max_single_copy = max_single_copy
        self.single_put_max = min(single_put_max, limits.S3_MAX_SINGLE_PUT)
        self.concurrency = concurrency
        self.provider = provider or ProviderSettings()
        if client is None:
            config = client_config(checksums, endpoint_url=endpoint_url, concurrency=concurrency)
            client = new_client(endpoint_url, config)
        self.client: S3Client = client
        self._small = SmallReads(bucket, self.endpoint_url, client.meta.region_name)

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Storage(s3://{self.bucket}/{self.prefix}{where})"

    # -- protocol: reading -------------------------------------------------------------------

    def same_service(self, other: Storage) -> bool:
        """One endpoint, one set of credentials: CopyObject works across its buckets."""
        return isinstance(other, S3Storage) and other.endpoint_url == self.endpoint_url

    def list_prefix(self, prefix: str, *, checksums: bool = False) -> list[ObjectInfo]:
        """With `checksums`, a HeadObject for each object whose listing names a full-object
        checksum (checksums.py: listings never carry the value)."""
        directory = self._dir(prefix)
        listed = list(self._listed(prefix))
        if not listed:
            raise ObjectMissing(f"nothing under {self._url(directory)}")
        found = with_checksums(self, directory, listed) if checksums else [i for i, _ in listed]
        found.sort(key=lambda info: info.key)
        return found

    def iter_prefix(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        return (info for info, _entry in self._listed(prefix, start_after))

    def _listed(
        self, prefix: str, start_after: str | None = None
    ) -> Iterator[tuple[ObjectInfo, Mapping[str, Any]]]:
        """Each listed object with its listing entry (which names checksum algorithms)."""
        directory = self._dir(prefix)
        what = f"ListObjectsV2 {self._url(directory)}"

        def list_call(args: dict[str, Any]) -> Mapping[str, Any]:
            call = partial(self.client.list_objects_v2, Bucket=self.bucket, **args)
            return self._request(what, call)

        first_after = directory + start_after if start_after else None
        readers = min(self.concurrency, listing.READERS)
        pages = listing.ordered_pages(
            in_this_context(list_call), directory, first_after, readers=readers
        )
        for page in pages:
            for entry in page:
                relative = entry["Key"][len(directory) :]
                size = entry.get("Size", 0)
                if not relative or (relative.endswith("/") and size == 0):
                    continue  # a console's "folder" marker, not a file
                # Such keys are legal in S3 but would escape or alias on a file tier.
                if _UNSAFE_SEGMENT.search(relative):
                    raise UnsafePath(f"{self._url(entry['Key'])} is no safe relative path")
                etag = str(entry.get("ETag") or "").strip('"')
                info = ObjectInfo(
                    key=relative,
                    size_bytes=size,
                    storage_class=entry.get("StorageClass") or DEFAULT_CLASS,
                    checksums={"etag": etag} if etag else {},
                    modified=entry.get("LastModified"),
                )
                yield info, entry

    def prefix_exists(self, prefix: str) -> bool:
        directory = self._dir(prefix)
        page = self._request(
            f"ListObjectsV2 {self._url(directory)}",
            partial(self.client.list_objects_v2, Bucket=self.bucket, Prefix=directory, MaxKeys=1),
        )
        return bool(page.get("Contents"))

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head(self._key(key))
        if response is None:
            return None
        return ObjectInfo(
            key=key,
            size_bytes=int(response.get("ContentLength", 0)),
            storage_class=response.get("StorageClass") or DEFAULT_CLASS,
            checksums=head_checksums(response),
        )

    def read_small(self, key: str, limit: int) -> bytes:
        """Through obstore (small_reads): a botocore GET costs this process several times
        the CPU, and an import makes one per Trainer checkpoint."""
        object_key = self._key(key)
        return self._small.read(object_key, limit, f"GetObject {self._url(object_key)}")

    def open_read(self, key: str) -> BinaryIO:
        object_key = self._key(key)
        what = f"GetObject {self._url(object_key)}"
        response = self._request(
            what, partial(self.client.get_object, Bucket=self.bucket, Key=object_key)
        )
        body: StreamingBody = response["Body"]

        def fetch(_offset: int, count: int | None) -> bytes:
            return call_translated(what, partial(body.read, count))  # a body is read in order

        return io.BufferedReader(ObjectReader(fetch, what, on_close=body.close), READ_BUFFER)

    # -- protocol: writing -------------------------------------------------------------------

    def upload(
        self, key: str, reader: BinaryIO, size: int, *, storage_class: str | None = None
    ) -> None:
        """One PutObject up to a part, multipart above: the bytes are read once, in order,
        and each request is retried from the bytes in memory (at most `concurrency` parts).
        S3 is asked to keep a full-object CRC64NVME (checksums.write_args), which botocore
        computes from the bytes sent and S3 checks on arrival."""
        if size < 0:
            raise ValueError(f"size {size} < 0")
        object_key = self._key(key)
        extra = self._placement(storage_class)
        single = {**extra, **write_args(self.request_checksums)}  # multipart: its own
        if size > self.part_size and is_seekable(reader) and size <= self.single_put_max:
            self._put_streamed(object_key, reader, size, single)
            return
        if size > self.part_size:
            self._upload_parts(object_key, reader, size, extra)
            return
        what = f"PutObject {self._url(object_key)}"
        data = self._read_part(reader, size, size, what)
        self._check_drained(reader, size, what)
        self._request(
            what,
            partial(
                self.client.put_object, Bucket=self.bucket, Key=object_key, Body=data, **single
            ),
        )

    def _put_streamed(
        self, object_key: str, reader: BinaryIO, size: int, extra: dict[str, Any]
    ) -> None:
        """One PutObject read straight from a seekable reader (a file): nothing is held in
        memory, and a retry seeks back. One request beats many parts up to a couple of
        hundred MiB (rclone's upload cutoff is 200 MiB for the same reason)."""
        what = f"PutObject {self._url(object_key)}"
        window = BoundedReader(reader, size, what)

        def put() -> Any:
            window.rewind()
            return self.client.put_object(
                Bucket=self.bucket,
                Key=object_key,
                Body=window,  # type: ignore[arg-type]  # a raw binary stream
                ContentLength=size,
                **extra,
            )

        self._request(what, put)
        window.seek(size)
        if reader.read(1):
            self._request(
                f"DeleteObject {self._url(object_key)}",
                partial(self.client.delete_object, Bucket=self.bucket, Key=object_key),
            )
            raise StorageError(f"{what}: the reader holds more than the {size} bytes announced")

    def copy_within(
        self,
        source: Storage,
        source_key: str,
        key: str,
        size: int,
        *,
        storage_class: str | None = None,
    ) -> None:
        if not isinstance(source, S3Storage) or not self.same_service(source):
            raise ValueError(f"{source!r} cannot be copied server-side into {self!r}")
        source_object = source._key(source_key)
        object_key = self._key(key)
        if source.bucket == self.bucket and source_object == object_key:
            # Two tiers on one prefix: the copy is a class change, a no-op when unchanged.
            self.set_storage_class(key, storage_class or DEFAULT_CLASS)
            return
        self._copy(source.bucket, source_object, object_key, size, storage_class)

    def _copy(
        self,
        source_bucket: str,
        source_object: str,
        object_key: str,
        size: int,
        storage_class: str | None,
    ) -> None:
        extra = self._placement(storage_class)
        if size > self.max_single_copy:
            self._copy_parts(source_bucket, source_object, object_key, size, extra)
            return
        # S3 computes the copy's CRC64NVME from the bytes it copies: a copy of a source whose
        # bytes no longer match the manifest shows it without being read back.
        extra.update(write_args(self.request_checksums))
        self._request(
            f"CopyObject {self._url(source_object, source_bucket)} to {self._url(object_key)}",
            partial(
                self.client.copy_object,
                Bucket=self.bucket,
                Key=object_key,
                CopySource={"Bucket": source_bucket, "Key": source_object},
                MetadataDirective="COPY",
                **extra,
            ),
        )

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """A copy onto itself; skipped when nothing would change, as S3 refuses such a copy."""
        object_key = self._key(key)
        head = self._head(object_key)
        if head is None:
            raise ObjectMissing(f"{self._url(object_key)} does not exist")
        if (head.get("StorageClass") or DEFAULT_CLASS) == storage_class:
            return
        size = int(head.get("ContentLength", 0))
        self._copy(self.bucket, object_key, object_key, size, storage_class)

    def delete_keys(self, keys: Iterable[str]) -> int:
        object_keys = [self._key(key) for key in keys]
        if not object_keys:
            return 0
        common = os.path.commonprefix(object_keys)  # noqa: RUF071 (a key prefix, not a path)
        if self.provider.object_lock is not None:
            versions.refuse_if_locked(self, common, set(object_keys))
        batches = limits.batched(object_keys, limits.S3_MAX_DELETE_KEYS)
        deleted = sum(
            self._in_parallel(partial(versions.delete_batch, self, batch) for batch in batches)
        )
        if not self.provider.keep_versions:
            versions.remove_leftovers(self, common, set(object_keys))
        return deleted

    def delete_prefix(self, prefix: str) -> int:
        """Deletes each listed page while the next is listed (ListObjectsV2 pages can only
        be fetched one after another; the deletes overlap them)."""
        if not prefix.strip("/"):
            raise UnsafePath("refusing to delete a tier's root")
        directory = self._dir(prefix)
        if self.provider.object_lock is not None:
            versions.refuse_if_locked(self, directory)
        pages = self._list_pages(directory)
        batches = ([entry["Key"] for entry in page] for page in pages)
        deleted = sum(
            self._in_parallel(partial(versions.delete_batch, self, batch) for batch in batches)
        )
        if not self.provider.keep_versions:
            versions.remove_leftovers(self, directory)  # a purge means the bytes are gone
        return deleted

    def abort_uploads(self, prefix: str) -> int:
        directory = self._dir(prefix)
        what = f"ListMultipartUploads {self._url(directory)}"
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": directory}
        uploads: list[tuple[str, str]] = []

        def call() -> ListMultipartUploadsOutputTypeDef | None:
            try:
                return self.client.list_multipart_uploads(**args)
            except ClientError as error:
                if error_code(error) == "NoSuchUpload":  # rclone's answer when there are none
                    return None
                raise

        while page := self._request(what, call):
            uploads.extend(
                (upload["Key"], upload["UploadId"])
                for upload in page.get("Uploads", [])
                if "Key" in upload and "UploadId" in upload
            )
            if not page.get("IsTruncated"):
                break
            args["KeyMarker"] = page.get("NextKeyMarker", "")
            args["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
        calls = (partial(self._abort, key, upload_id) for key, upload_id in uploads)
        return sum(self._in_parallel(calls))

    # -- protocol: archive classes -----------------------------------------------------------

    def _archive_head(self, key: str) -> tuple[dict[str, Any], bool, bool]:
        """The object's HeadObject answer, whether it sits in an archive (a Glacier class or
        an Intelligent-Tiering archive tier) and whether a restore is under way."""
        object_key = self._key(key)
        head = self._head(object_key)
        if head is None:
            raise ObjectMissing(f"{self._url(object_key)} does not exist")
        archived = (head.get("StorageClass") or DEFAULT_CLASS) in ARCHIVE_CLASSES or bool(
            head.get("ArchiveStatus")
        )
        ongoing = 'ongoing-request="true"' in str(head.get("Restore") or "")
        return head, archived, ongoing

    def restore_state(self, key: str) -> RestoreState:
        head, archived, ongoing = self._archive_head(key)
        if ongoing:
            return "restoring"
        if archived and not head.get("Restore"):
            return "archived"
        return "readable"

    def request_restore(self, key: str, *, days: int = 1) -> None:
        """Restoring a restored copy again only extends its expiry; while one restore runs
        another is not sent (S3 would refuse it with RestoreAlreadyInProgress anyway)."""
        head, archived, ongoing = self._archive_head(key)
        if not archived or ongoing:
            return
        object_key = self._key(key)
        request: RestoreRequestTypeDef = {"GlacierJobParameters": {"Tier": "Standard"}}
        if not head.get("ArchiveStatus"):  # Intelligent-Tiering refuses Days
            request["Days"] = days

        def call() -> None:
            try:
                self.client.restore_object(
                    Bucket=self.bucket, Key=object_key, RestoreRequest=request
                )
            except ClientError as error:
                if error_code(error) != "RestoreAlreadyInProgress":
                    raise

        self._request(f"RestoreObject {self._url(object_key)}", call)
