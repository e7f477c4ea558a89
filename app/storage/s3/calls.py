"""The request plumbing every S3 operation shares: keys and URLs, one retried request, a
bounded parallel run, HeadObject (checksums.py says which checksums its answer vouches
for), and ListObjectsV2 page by page.

S3Storage is built in three layers so that none is too long to read whole: this one,
the multipart transfers over it (multipart.S3Multipart), and the Storage protocol on top
(adapter.S3Storage), which sets every attribute declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from app.domain.provider import ProviderSettings
from app.storage.base import ObjectMissing, StorageError, join_key
from app.storage.retry import in_this_context, retrying
from app.storage.s3.client import ChecksumMode
from app.storage.s3.errors import call_translated
from app.storage.streams import read_up_to

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectTypeDef

T = TypeVar("T")

LIST_PAGE = 1000  # ListObjectsV2's own maximum; one page is one DeleteObjects batch


class S3Calls:
    """One tier's requests: `bucket` with keys under `prefix`, through `client`."""

    bucket: str
    prefix: str
    endpoint_url: str | None
    request_checksums: ChecksumMode
    part_size: int
    max_single_copy: int
    single_put_max: int
    concurrency: int
    client: S3Client
    provider: ProviderSettings

    def _placement(self, storage_class: str | None) -> dict[str, Any]:
        """What every object the service writes here carries: its class, and on a tier
        with `object_lock` the lock, retained from now for the tier's `retain`."""
        extra: dict[str, Any] = {"StorageClass": storage_class} if storage_class else {}
        lock = self.provider.object_lock
        if lock is not None:
            extra["ObjectLockMode"] = lock.mode
            extra["ObjectLockRetainUntilDate"] = datetime.now(UTC) + lock.retain
        return extra

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
        return retrying(partial(call_translated, what, call), what=what)

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

    def _list_pages(
        self, directory: str, start_after: str | None = None
    ) -> Iterator[list[ObjectTypeDef]]:
        """ListObjectsV2 page by page, each page retried on its own continuation token;
        `start_after` (relative to `directory`) starts after that key."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": directory, "MaxKeys": LIST_PAGE}
        if start_after:
            args["StartAfter"] = directory + start_after
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

    def _read_part(self, reader: BinaryIO, size: int, total: int, what: str) -> bytes:
        data = read_up_to(reader, size)
        if len(data) != size:
            raise StorageError(f"{what}: the reader ended early, short of the {total} bytes")
        return data

    def _check_drained(self, reader: BinaryIO, size: int, what: str) -> None:
        if reader.read(1):
            raise StorageError(f"{what}: the reader holds more than the {size} bytes announced")
