"""S3 and S3-compatible tiers (AWS, MinIO, Ceph, rclone, moto...).

Every transfer is built here from low-level calls (PutObject, UploadPart, UploadPartCopy,
CopyObject): boto3's managed transfer (s3transfer behind upload_fileobj / copy /
download_fileobj) is never used. That keeps memory bounded by our own part pipeline,
gives one retry policy (retry.retrying, with botocore's own retries off), and means the
CRT transfer client, which boto3 may pick for managed transfers and which ignores
`endpoint_url`, can never be chosen for an S3-compatible tier.

Credentials come from boto3's default chain only and appear in no log or message.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from datetime import datetime
from functools import cache, partial
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, Literal, TypeVar

import boto3
import botocore.session
import urllib3.exceptions
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.utils import parse_timestamp

from app.storage import limits
from app.storage.base import (
    ArchivedObject,
    ObjectInfo,
    ObjectMissing,
    PermissionDenied,
    RestoreState,
    Storage,
    StorageError,
    TransientError,
    UnsafePath,
    join_key,
)
from app.storage.limits import MiB
from app.storage.retry import in_this_context, retrying
from app.storage.streams import BoundedReader, ObjectReader, is_seekable, read_up_to

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import (
        CompletedPartTypeDef,
        ListMultipartUploadsOutputTypeDef,
        ObjectTypeDef,
        RestoreRequestTypeDef,
    )

T = TypeVar("T")
log = logging.getLogger("app.storage")

# Error codes worth another try. RequestTimeTooSkewed is left out on purpose: botocore does
# not correct for clock skew, so every attempt would be refused the same way; it surfaces at
# once as a StorageError that names the clock.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
PERMISSION_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId"})
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
DEFAULT_CLASS = "STANDARD"
LIST_PAGE = 1000  # ListObjectsV2's own maximum; one page is one DeleteObjects batch
# Server-side copy parts move no bytes through us, so they are large (fewer requests) yet
# short enough to finish well within the read timeout.
COPY_PART = 256 * MiB
READ_BUFFER = 1 * MiB
SINGLE_PUT_MAX = 200 * MiB  # a seekable source up to this goes in one streamed PutObject
# Upload parts held in memory at once by this whole process, whatever the number of files
# and uploads running: with 16 MiB parts, 128 MiB. Keeps a worker's peak memory bounded
# however large the checkpoint and however many shards copy in parallel.
BUFFERED_PARTS = 8
_part_budget = threading.BoundedSemaphore(BUFFERED_PARTS)


class _BufferedPart(Generic[T]):
    """An upload call holding one part's bytes and one unit of the process's part budget,
    given back once, whether the call ran, failed or was cancelled before it started."""

    def __init__(self, call: Callable[[bytes], T], data: bytes) -> None:
        self._call: Callable[[bytes], T] | None = call
        self._data: bytes | None = data

    def __call__(self) -> T:
        call, data = self._call, self._data
        assert call is not None and data is not None
        try:
            return call(data)
        finally:
            self.discard()

    def discard(self) -> None:
        if self._data is not None:
            self._data = self._call = None
            _part_budget.release()


_MD5 = re.compile(r"[0-9a-f]{32}")


# -- error translation -----------------------------------------------------------------------


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def translate(error: BaseException, what: str) -> StorageError:
    """One place that decides what a botocore/urllib3 failure means to our callers."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, ClientError):
        code = _code(error)
        message = str(error.response.get("Error", {}).get("Message", "") or "")
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"{what}: {code or status}" + (f" {message}" if message else "")
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientError(text)
        if code in MISSING_CODES:
            return ObjectMissing(text)
        if code == "InvalidObjectState":  # a 403 too, but a restore heals it
            return ArchivedObject(text)
        if status == 403 or code in PERMISSION_CODES:
            return PermissionDenied(text)  # rights, an object lock or a legal hold
        if code == "RequestTimeTooSkewed":
            return StorageError(f"{text} (the local clock differs from the server's)")
        return StorageError(text)
    if isinstance(error, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(error):
        return StorageError(f"{what}: {error}")
    if isinstance(
        error,
        BotoConnectionError  # endpoint unreachable, connect timeout, SSL EOF, proxy
        | HTTPClientError  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
        | IncompleteReadError
        | ChecksumError
        | FlexibleChecksumError  # bytes damaged in transit; a new request may do better
        | urllib3.exceptions.ProtocolError
        | urllib3.exceptions.TimeoutError
        | OSError,  # ConnectionResetError, TimeoutError from a socket mid-stream
    ):
        return TransientError(f"{what}: {type(error).__name__}: {error}")
    return StorageError(f"{what}: {type(error).__name__}: {error}")


_FAILURES = (ClientError, BotoCoreError, urllib3.exceptions.HTTPError, OSError)


def _call(what: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except _FAILURES as error:
        raise translate(error, what) from error


def _checksums(head: Any) -> dict[str, str]:
    """Fingerprints of a HeadObject answer. A plain ETag is the MD5 unless KMS or a
    customer key encrypted the object; a SHA-256/CRC32C is only comparable with a manifest
    when it covers the whole object, not the parts (composite, "<value>-<parts>")."""
    found: dict[str, str] = {}
    etag = str(head.get("ETag") or "").strip('"')
    if etag:
        found["etag"] = etag
    encrypted = head.get("SSECustomerAlgorithm") or head.get("ServerSideEncryption") in (
        "aws:kms",
        "aws:kms:dsse",
    )
    if _MD5.fullmatch(etag) and not encrypted:
        found["md5"] = etag
    checksum_type = head.get("ChecksumType")
    # Some servers (moto) send a multipart object's composite checksum with no "-N" and no
    # ChecksumType: without FULL_OBJECT said outright, a multipart object's is not trusted.
    full = checksum_type == "FULL_OBJECT" or (checksum_type is None and "-" not in etag)
    for name, member in (("sha256", "ChecksumSHA256"), ("crc32c", "ChecksumCRC32C")):
        value = head.get(member)
        if not full or not value or "-" in value:
            continue
        try:
            found[name] = base64.b64decode(value, validate=True).hex()
        except (binascii.Error, ValueError):
            continue
    return found


def _parse_timestamp(value: str) -> datetime:
    """ISO 8601 (S3's XML) parsed by the standard library, anything else by botocore."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return parse_timestamp(value)
    return parsed if parsed.tzinfo is not None else parse_timestamp(value)


@cache
def _session() -> boto3.session.Session:
    core = botocore.session.get_session()
    # botocore parses each listed object's LastModified with dateutil, about 0.3 ms apiece:
    # most of the time spent on a 1,000-key page (and on deleting a large prefix).
    core.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=_parse_timestamp
    )
    return boto3.session.Session(botocore_session=core)


_session_lock = threading.Lock()


def _new_client(endpoint_url: str | None, config: Config) -> S3Client:
    """Clients of one shared session, which loads the service model once (a session per
    adapter costs ~0.15 s). Sessions, unlike their clients, are not thread-safe: hence the lock."""
    with _session_lock:
        return _session().client("s3", endpoint_url=endpoint_url, config=config)


def _normal_endpoint(url: str | None) -> str | None:
    return url.rstrip("/") if url else None


class S3Storage:
    """One tier: `bucket` with keys under `prefix`."""

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
        concurrency: int = 8,
    ) -> None:
        if request_checksums not in ("when_supported", "when_required"):
            raise ValueError(f"request_checksums {request_checksums!r}")
        if not limits.S3_MIN_PART <= part_size <= limits.S3_MAX_SINGLE_PUT:
            raise ValueError(f"part_size {part_size} is outside S3's part size limits")
        if not 0 < max_single_copy <= limits.S3_MAX_SINGLE_COPY:
            raise ValueError(f"max_single_copy {max_single_copy} is outside (0, 5 GiB]")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        checksums: Literal["when_supported", "when_required"] = (
            "when_required" if request_checksums == "when_required" else "when_supported"
        )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = _normal_endpoint(endpoint_url)
        self.request_checksums = checksums
        self.part_size = part_size
        self.max_single_copy = max_single_copy
        self.single_put_max = min(single_put_max, limits.S3_MAX_SINGLE_PUT)
        self.concurrency = concurrency
        config = Config(
            request_checksum_calculation=checksums,
            response_checksum_validation=checksums,
            retries={"total_max_attempts": 1, "mode": "standard"},  # retry.retrying retries
            max_pool_connections=max(10, 2 * concurrency),
            connect_timeout=10,
            # Per socket read, not per request: long enough for S3 to answer a large
            # server-side part copy or a CompleteMultipartUpload.
            read_timeout=120,
            tcp_keepalive=True,
            # S3-compatible servers are addressed by path: their hostnames rarely have a
            # wildcard DNS entry per bucket.
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        self.client: S3Client = _new_client(endpoint_url, config)

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Storage(s3://{self.bucket}/{self.prefix}{where})"

    # -- helpers -----------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _dir(self, prefix: str) -> str:
        """The object key prefix of a directory-like `prefix`, with its trailing '/', so
        'ck' never matches 'ck2/...'."""
        relative = prefix.strip("/")
        full = join_key(self.prefix, relative) if relative else self.prefix
        return f"{full}/" if full else ""

    def _url(self, object_key: str, bucket: str | None = None) -> str:
        return f"s3://{bucket or self.bucket}/{object_key}"

    def _request(self, what: str, call: Callable[[], T]) -> T:
        """One idempotent request, translated and retried."""
        return retrying(partial(_call, what, call), what=what)

    def _in_parallel(self, calls: Iterable[Callable[[], T]]) -> list[T]:
        """Run `calls` with at most `concurrency` in flight, taking the next one from the
        iterable only when a slot is free, so a producer (a reader cut into parts, a
        listing) runs at most that far ahead, which bounds memory. The first failure
        cancels what has not started and is raised once the running calls have finished."""
        source = iter(calls)
        results: list[T] = []
        pending: set[Future[T]] = set()
        calls_by_future: dict[Future[T], Callable[[], T]] = {}
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="s3") as pool:
            try:
                while True:
                    if len(pending) >= self.concurrency:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        results.extend(future.result() for future in done)
                        continue
                    call = next(source, None)
                    if call is None:
                        break
                    future = pool.submit(in_this_context(call))  # the caller's retry tally
                    pending.add(future)
                    if hasattr(call, "discard"):
                        calls_by_future[future] = call
                        future.add_done_callback(lambda f: calls_by_future.pop(f, None))
                    del call, future  # a part's bytes live only as long as its request
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    results.extend(future.result() for future in done)
            except BaseException:
                for future in pending:
                    if future.cancel():
                        discard = getattr(calls_by_future.pop(future, None), "discard", None)
                        if discard is not None:
                            discard()
                raise
        return results

    def _head(self, object_key: str, bucket: str | None = None) -> dict[str, Any] | None:
        what = f"HeadObject {self._url(object_key, bucket)}"
        try:
            response = self._request(
                what,
                partial(
                    self.client.head_object,
                    Bucket=bucket or self.bucket,
                    Key=object_key,
                    ChecksumMode="ENABLED",
                ),
            )
        except ObjectMissing:
            return None
        return dict(response)

    def _list_pages(self, directory: str) -> Iterator[list[ObjectTypeDef]]:
        """ListObjectsV2 page by page, each page retried on its own continuation token."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": directory, "MaxKeys": LIST_PAGE}
        what = f"ListObjectsV2 {self._url(directory)}"
        while True:
            page = self._request(what, partial(self.client.list_objects_v2, **args))
            contents = page.get("Contents", [])
            if contents:
                yield contents
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            args["ContinuationToken"] = token

    # -- protocol: reading -------------------------------------------------------------------

    def same_service(self, other: Storage) -> bool:
        """One endpoint, one set of credentials: CopyObject works across its buckets."""
        return isinstance(other, S3Storage) and other.endpoint_url == self.endpoint_url

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        directory = self._dir(prefix)
        found: list[ObjectInfo] = []
        for page in self._list_pages(directory):
            for entry in page:
                relative = entry["Key"][len(directory) :]
                size = entry.get("Size", 0)
                if not relative or (relative.endswith("/") and size == 0):
                    continue  # a console's "folder" marker, not a file
                # Such keys are legal in S3 but would escape or alias on a file tier.
                if any(part in ("", ".", "..") for part in relative.split("/")):
                    raise UnsafePath(f"{self._url(entry['Key'])} is no safe relative path")
                etag = str(entry.get("ETag") or "").strip('"')
                found.append(
                    ObjectInfo(
                        key=relative,
                        size_bytes=size,
                        storage_class=entry.get("StorageClass") or DEFAULT_CLASS,
                        checksums={"etag": etag} if etag else {},
                        modified=entry.get("LastModified"),
                    )
                )
        if not found:
            raise ObjectMissing(f"nothing under {self._url(directory)}")
        found.sort(key=lambda info: info.key)
        return found

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
            checksums=_checksums(response),
        )

    def open_read(self, key: str) -> BinaryIO:
        object_key = self._key(key)
        what = f"GetObject {self._url(object_key)}"
        response = self._request(
            what, partial(self.client.get_object, Bucket=self.bucket, Key=object_key)
        )
        body: StreamingBody = response["Body"]

        def fetch(_offset: int, count: int | None) -> bytes:
            return _call(what, partial(body.read, count))  # a body is read in order

        return io.BufferedReader(ObjectReader(fetch, what, on_close=body.close), READ_BUFFER)

    # -- protocol: writing -------------------------------------------------------------------

    def upload(
        self, key: str, reader: BinaryIO, size: int, *, storage_class: str | None = None
    ) -> None:
        """One PutObject up to a part, multipart above: the bytes are read once, in order,
        and each request is retried from the bytes in memory (at most `concurrency` parts)."""
        if size < 0:
            raise ValueError(f"size {size} < 0")
        object_key = self._key(key)
        extra: dict[str, Any] = {"StorageClass": storage_class} if storage_class else {}
        if size > self.part_size and is_seekable(reader) and size <= self.single_put_max:
            self._put_streamed(object_key, reader, size, extra)
            return
        if size > self.part_size:
            self._upload_parts(object_key, reader, size, extra)
            return
        what = f"PutObject {self._url(object_key)}"
        data = self._read_part(reader, size, size, what)
        self._check_drained(reader, size, what)
        self._request(
            what,
            partial(self.client.put_object, Bucket=self.bucket, Key=object_key, Body=data, **extra),
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

    def _read_part(self, reader: BinaryIO, size: int, total: int, what: str) -> bytes:
        data = read_up_to(reader, size)
        if len(data) != size:
            raise StorageError(f"{what}: the reader ended early, short of the {total} bytes")
        return data

    def _check_drained(self, reader: BinaryIO, size: int, what: str) -> None:
        if reader.read(1):
            raise StorageError(f"{what}: the reader holds more than the {size} bytes announced")

    def _upload_parts(
        self, object_key: str, reader: BinaryIO, size: int, extra: dict[str, Any]
    ) -> None:
        what = f"multipart upload to {self._url(object_key)}"
        checksum = self.request_checksums == "when_supported"
        if checksum:
            # As s3transfer does: parts carry CRC32s that CompleteMultipartUpload lists.
            extra = {**extra, "ChecksumAlgorithm": "CRC32"}
        upload_id = self._create_upload(object_key, extra, what)
        try:

            def parts() -> Iterator[Callable[[], CompletedPartTypeDef]]:
                for part in limits.plan_parts(size, self.part_size):
                    _part_budget.acquire()
                    try:
                        data = self._read_part(reader, part.size, size, what)
                    except BaseException:
                        _part_budget.release()
                        raise
                    call = _BufferedPart(
                        partial(self._upload_part, object_key, upload_id, part.number), data
                    )
                    del data
                    yield call
                    del call
                self._check_drained(reader, size, what)

            completed = self._in_parallel(parts())
            self._complete(object_key, upload_id, completed, what)
        except BaseException:
            self._abort_after_failure(object_key, upload_id)
            raise

    def _create_upload(self, object_key: str, extra: dict[str, Any], what: str) -> str:
        # Not idempotent: a retry after a lost answer leaves an empty upload behind, which
        # abort_uploads (or a bucket lifecycle rule) collects.
        response = self._request(
            f"CreateMultipartUpload ({what})",
            partial(
                self.client.create_multipart_upload, Bucket=self.bucket, Key=object_key, **extra
            ),
        )
        return response["UploadId"]

    def _upload_part(
        self, object_key: str, upload_id: str, number: int, data: bytes
    ) -> CompletedPartTypeDef:
        extra: dict[str, Any] = {}
        if self.request_checksums == "when_supported":
            extra["ChecksumAlgorithm"] = "CRC32"

        def send() -> Any:
            # A fresh file object each attempt, not bytes: botocore glues a bytes body to
            # the headers before sending, a second copy of every part in flight.
            return self.client.upload_part(
                Bucket=self.bucket,
                Key=object_key,
                UploadId=upload_id,
                PartNumber=number,
                Body=io.BytesIO(data),
                **extra,
            )

        response = self._request(f"UploadPart {number} of {self._url(object_key)}", send)
        part: CompletedPartTypeDef = {"PartNumber": number, "ETag": response["ETag"]}
        if "ChecksumCRC32" in response:
            part["ChecksumCRC32"] = response["ChecksumCRC32"]
        return part

    def _complete(
        self, object_key: str, upload_id: str, parts: list[CompletedPartTypeDef], what: str
    ) -> None:
        parts.sort(key=lambda part: part["PartNumber"])
        attempts = 0

        def complete() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=object_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except ClientError as error:
                # A retry whose first attempt completed the upload but lost its answer: the
                # upload is gone because the object exists. (What it holds is verified
                # against the source before anything is removed.)
                if _code(error) != "NoSuchUpload" or attempts == 1:
                    raise
                if self._head(object_key) is None:
                    raise

        self._request(f"CompleteMultipartUpload ({what})", complete)

    def _abort(self, object_key: str, upload_id: str) -> bool:
        """Abort one upload; False when it was already gone (aborted, completed, expired)."""

        def call() -> bool:
            try:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=object_key, UploadId=upload_id
                )
            except ClientError as error:
                if _code(error) == "NoSuchUpload":
                    return False
                raise
            return True

        return self._request(f"AbortMultipartUpload {self._url(object_key)}", call)

    def _abort_after_failure(self, object_key: str, upload_id: str) -> None:
        """Failing to abort is logged, not raised, so the caller sees the error that made us
        abort; abort_uploads or a bucket lifecycle rule collects the leftover."""
        try:
            self._abort(object_key, upload_id)
        except StorageError as error:
            log.warning("could not abort a multipart upload", extra={"error": str(error)})

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
        extra: dict[str, Any] = {"StorageClass": storage_class} if storage_class else {}
        if size > self.max_single_copy:
            self._copy_parts(source_bucket, source_object, object_key, size, extra)
            return
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

    def _copy_parts(
        self,
        source_bucket: str,
        source_object: str,
        object_key: str,
        size: int,
        extra: dict[str, Any],
    ) -> None:
        """UploadPartCopy ranges in parallel. The source's headers travel along, as with
        CopyObject's COPY directive, and every part names the source's ETag, so a source
        replaced halfway fails the copy instead of mixing two versions."""
        source_url = self._url(source_object, source_bucket)
        what = f"multipart copy of {source_url} to {self._url(object_key)}"
        head = self._head(source_object, source_bucket)
        if head is None:
            raise ObjectMissing(f"{what}: the source does not exist")
        if int(head.get("ContentLength", -1)) != size:
            raise StorageError(f"{what}: the source holds {head.get('ContentLength')} bytes")
        for member in (
            "ContentType",
            "ContentEncoding",
            "ContentDisposition",
            "ContentLanguage",
            "CacheControl",
            "Metadata",
        ):
            if head.get(member):
                extra = {member: head[member], **extra}
        upload_id = self._create_upload(object_key, extra, what)
        try:
            preferred = max(self.part_size, min(self.max_single_copy, COPY_PART))
            calls = (
                partial(
                    self._copy_part,
                    (source_bucket, source_object, str(head["ETag"])),
                    object_key,
                    upload_id,
                    part,
                )
                for part in limits.plan_parts(size, preferred)
            )
            completed = self._in_parallel(calls)
            self._complete(object_key, upload_id, completed, what)
        except BaseException:
            self._abort_after_failure(object_key, upload_id)
            raise

    def _copy_part(
        self,
        source: tuple[str, str, str],  # bucket, key, ETag
        object_key: str,
        upload_id: str,
        part: limits.Part,
    ) -> CompletedPartTypeDef:
        source_bucket, source_object, etag = source
        what = f"UploadPartCopy {part.number} to {self._url(object_key)}"
        response = self._request(
            what,
            partial(
                self.client.upload_part_copy,
                Bucket=self.bucket,
                Key=object_key,
                UploadId=upload_id,
                PartNumber=part.number,
                CopySource={"Bucket": source_bucket, "Key": source_object},
                CopySourceRange=f"bytes={part.offset}-{part.offset + part.size - 1}",
                CopySourceIfMatch=etag,
            ),
        )
        part_etag = response.get("CopyPartResult", {}).get("ETag")
        if not part_etag:
            # rclone answers UploadPartCopy with 200 and copies nothing.
            raise StorageError(f"{what}: no ETag in the answer; the server copied no part")
        return {"PartNumber": part.number, "ETag": part_etag}

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
        batches = limits.batched((self._key(key) for key in keys), limits.S3_MAX_DELETE_KEYS)
        return sum(self._in_parallel(partial(self._delete_batch, batch) for batch in batches))

    def _delete_batch(self, object_keys: list[str]) -> int:
        """One DeleteObjects; a retry sends only the keys the previous answer reported."""
        what = f"DeleteObjects of {len(object_keys)} keys under {self._url(self.prefix)}"
        remaining = object_keys

        def call() -> None:
            nonlocal remaining
            response = _call(
                what,
                partial(
                    self.client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": key} for key in remaining], "Quiet": True},
                ),
            )
            errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if not errors:
                return
            failed = {str(e.get("Key")) for e in errors}
            remaining = [key for key in remaining if key in failed] or remaining
            codes = sorted({str(e.get("Code")) for e in errors})
            first = errors[0]
            text = (
                f"{what}: {len(errors)} keys not deleted ({', '.join(codes)}), "
                f"e.g. {first.get('Key')}: {first.get('Message', '')}"
            )
            if all(code in TRANSIENT_CODES for code in codes):
                raise TransientError(text)
            if any(code in PERMISSION_CODES for code in codes):
                raise PermissionDenied(text)  # a locked or held object among them
            raise StorageError(text)

        retrying(call, what=what)
        return len(object_keys)

    def delete_prefix(self, prefix: str) -> int:
        """Deletes each listed page while the next is listed (ListObjectsV2 pages can only
        be fetched one after another; the deletes overlap them)."""
        if not prefix.strip("/"):
            raise UnsafePath("refusing to delete a tier's root")
        pages = self._list_pages(self._dir(prefix))
        batches = ([entry["Key"] for entry in page] for page in pages)
        return sum(self._in_parallel(partial(self._delete_batch, batch) for batch in batches))

    def abort_uploads(self, prefix: str) -> int:
        directory = self._dir(prefix)
        what = f"ListMultipartUploads {self._url(directory)}"
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": directory}
        uploads: list[tuple[str, str]] = []

        def call() -> ListMultipartUploadsOutputTypeDef | None:
            try:
                return self.client.list_multipart_uploads(**args)
            except ClientError as error:
                if _code(error) == "NoSuchUpload":  # rclone's answer when there are none
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
                if _code(error) != "RestoreAlreadyInProgress":
                    raise

        self._request(f"RestoreObject {self._url(object_key)}", call)
