"""S3 multipart transfers: an upload cut into parts read once, in order, in bounded memory,
and a server-side copy in UploadPartCopy ranges; both completed, or aborted on failure.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, TypeVar

from botocore.exceptions import ClientError

from app.storage import limits
from app.storage.base import ObjectMissing, StorageError
from app.storage.limits import MiB
from app.storage.s3 import checksums
from app.storage.s3.calls import S3Calls
from app.storage.s3.errors import error_code

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

T = TypeVar("T")
log = logging.getLogger("app.storage")

# Server-side copy parts move no bytes through us, so they are large (fewer requests) yet
# short enough to finish well within the read timeout.
COPY_PART = 256 * MiB
# Upload parts held in memory at once by this whole process, whatever the number of files
# and uploads running: with 16 MiB parts, 80 MiB. Keeps a worker's peak memory bounded
# however large the checkpoint and however many shards copy in parallel: a worker holds
# about 130 MiB before its first part, and one 2 GiB upload peaked at 285 MiB with 8
# parts, at 231-257 MiB with 6 (over the 256 MiB a worker may use in one run of four),
# and at 222 MiB with 5, as fast within the noise (bench/README.md, transfer benchmark).
BUFFERED_PARTS = 5
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


class S3Multipart(S3Calls):
    """Multipart uploads and copies of one tier (see calls.S3Calls for the layers)."""

    def _upload_parts(
        self, object_key: str, reader: BinaryIO, size: int, extra: dict[str, Any]
    ) -> None:
        what = f"multipart upload to {self._url(object_key)}"
        # Parts carry CRC64NVMEs that CompleteMultipartUpload lists, and S3 combines them
        # into the whole object's (a composite checksum would match nothing).
        extra = {**extra, **checksums.write_args(self.request_checksums, multipart=True)}
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
            extra["ChecksumAlgorithm"] = checksums.WRITE_ALGORITHM

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
        if checksums.PART_MEMBER in response:
            part[checksums.PART_MEMBER] = response[checksums.PART_MEMBER]
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
                if error_code(error) != "NoSuchUpload" or attempts == 1:
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
                if error_code(error) == "NoSuchUpload":
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
        # S3 computes each copied part's CRC64NVME and combines them: the copy gets a
        # full-object checksum comparable with its source's and the manifest's.
        extra = {**extra, **checksums.write_args(self.request_checksums, multipart=True)}
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
        result: Mapping[str, Any] = response.get("CopyPartResult", {})
        part_etag = result.get("ETag")
        if not part_etag:
            # rclone answers UploadPartCopy with 200 and copies nothing.
            raise StorageError(f"{what}: no ETag in the answer; the server copied no part")
        completed: CompletedPartTypeDef = {"PartNumber": part.number, "ETag": part_etag}
        if checksums.PART_MEMBER in result:  # AWS's; moto computes the whole at completion
            completed[checksums.PART_MEMBER] = result[checksums.PART_MEMBER]
        return completed
