"""S3Storage against real servers: moto's S3 server, `rclone serve s3`, and moto behind a
proxy that fails requests on demand. API calls are counted with botocore event hooks on
the adapter's own client. Nothing of ours is mocked; only the retry backoff and, in one
test, the listing page size are turned down."""

# Fixtures imported from s3_servers are named again by the tests that use them.

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import google_crc32c
import pytest
from awscrt.checksums import crc64nvme as crc64nvme_of
from botocore.utils import parse_timestamp

from app.storage import retry
from app.storage.base import (
    ArchivedObject,
    ObjectInfo,
    ObjectMissing,
    StorageError,
    TransientError,
    UnsafePath,
)
from app.storage.limits import MiB
from app.storage.s3 import S3Storage
from app.storage.s3 import calls as s3_calls
from app.storage.s3 import client as s3_clients
from tests.storage.faulty_proxy import FaultyProxy
from tests.storage.ports import free_port
from tests.storage.s3_servers import (
    S3Endpoint,
    dummy_credentials,
    new_bucket,
    s3_client,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PART = 5 * MiB


class Calls:
    """How many times each S3 operation was sent by one storage's client (retries included),
    and the most requests of one operation in flight at once."""

    def __init__(self, storage: S3Storage, *operations: str) -> None:
        self.counts: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.most_in_flight: Counter[str] = Counter()
        self._lock = threading.Lock()
        events = storage.client.meta.events
        for operation in operations:
            events.register(f"before-call.s3.{operation}", self._before(operation))
            events.register(f"after-call.s3.{operation}", self._after(operation))

    def _before(self, operation: str) -> Any:
        def hook(**_: Any) -> None:
            with self._lock:
                self.counts[operation] += 1
                self.in_flight[operation] += 1
                self.most_in_flight[operation] = max(
                    self.most_in_flight[operation], self.in_flight[operation]
                )

        return hook

    def _after(self, operation: str) -> Any:
        def hook(**_: Any) -> None:
            with self._lock:
                self.in_flight[operation] -= 1

        return hook

    def __getitem__(self, operation: str) -> int:
        return self.counts[operation]


@pytest.fixture
def bucket(moto_s3: S3Endpoint) -> str:
    return new_bucket(moto_s3)


@pytest.fixture
def raw(moto_s3: S3Endpoint) -> S3Client:
    return s3_client(moto_s3)


@pytest.fixture
def storage(moto_s3: S3Endpoint, bucket: str) -> S3Storage:
    return S3Storage(bucket, "tier", endpoint_url=moto_s3.url, part_size=PART, concurrency=4)


@pytest.fixture
def instant_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries keep their count but wait a millisecond instead of the real backoff."""
    monkeypatch.setattr(retry, "backoff", lambda attempt, **_: 0.001)


@pytest.fixture
def proxy(moto_s3: S3Endpoint) -> Iterator[FaultyProxy]:
    with FaultyProxy(moto_s3.url) as running:
        yield running


def read_all(storage: S3Storage, key: str) -> bytes:
    with storage.open_read(key) as stream:
        return stream.read()


# -- reading and writing ---------------------------------------------------------------------


def test_small_objects_round_trip(storage: S3Storage, raw: S3Client, bucket: str) -> None:
    storage.upload("ck/a.bin", io.BytesIO(b"alpha"), 5)
    storage.upload("ck/sub/empty", io.BytesIO(b""), 0)
    storage.upload("ck2/c.bin", io.BytesIO(b"c"), 1)  # shares "ck" as a string prefix only

    listed = storage.list_prefix("ck")
    assert [(info.key, info.size_bytes, info.storage_class) for info in listed] == [
        ("a.bin", 5, "STANDARD"),
        ("sub/empty", 0, "STANDARD"),
    ]
    assert raw.head_object(Bucket=bucket, Key="tier/ck/a.bin")["ContentLength"] == 5
    md5 = hashlib.md5(b"alpha").hexdigest()
    assert listed[0].checksums == {"etag": md5}
    crc64nvme = f"{crc64nvme_of(b'alpha'):016x}"  # asked for by every upload
    assert storage.head("ck/a.bin") == ObjectInfo(
        "ck/a.bin", 5, "STANDARD", {"etag": md5, "md5": md5, "crc64nvme": crc64nvme}
    )
    assert read_all(storage, "ck/a.bin") == b"alpha"
    assert read_all(storage, "ck/sub/empty") == b""
    assert storage.prefix_exists("ck")
    assert storage.prefix_exists("ck/sub/")
    assert not storage.prefix_exists("c")
    assert storage.head("ck/none") is None
    with pytest.raises(ObjectMissing):
        storage.open_read("ck/none")
    with pytest.raises(ObjectMissing):
        storage.list_prefix("nothing")


def test_multipart_upload_round_trip_in_bounded_parts(moto_s3: S3Endpoint, bucket: str) -> None:
    storage = S3Storage(
        bucket,
        "tier",
        endpoint_url=moto_s3.url,
        part_size=PART,
        concurrency=2,
        single_put_max=PART,  # a seekable reader would otherwise go in one streamed PUT
    )
    data = os.urandom(3 * PART + 123)  # four parts, the last small
    calls = Calls(storage, "PutObject", "UploadPart", "CompleteMultipartUpload")
    done_parts = 0
    most_ahead = 0

    def part_done(**_: Any) -> None:
        nonlocal done_parts
        done_parts += 1

    storage.client.meta.events.register("after-call.s3.UploadPart", part_done)

    class Reader(io.BytesIO):
        """Records how far reading runs ahead of the finished parts."""

        def read(self, size: int | None = -1) -> bytes:
            nonlocal most_ahead
            chunk = super().read(size)
            if chunk:
                parts_read = -(-self.tell() // PART)
                most_ahead = max(most_ahead, parts_read - done_parts)
            return chunk

    storage.upload("big/x.bin", Reader(data), len(data), storage_class="STANDARD_IA")

    assert (calls["PutObject"], calls["UploadPart"], calls["CompleteMultipartUpload"]) == (0, 4, 1)
    assert calls.most_in_flight["UploadPart"] <= 2
    assert most_ahead <= 2  # memory stays within concurrency * part_size
    info = storage.head("big/x.bin")
    assert info is not None
    assert info.size_bytes == len(data)
    assert info.storage_class == "STANDARD_IA"
    assert info.checksums["etag"].endswith("-4")
    assert "md5" not in info.checksums
    assert read_all(storage, "big/x.bin") == data
    assert [(i.key, i.size_bytes) for i in storage.list_prefix("big")] == [("x.bin", len(data))]


def test_a_seekable_source_streams_in_one_put_and_a_retry_rewinds_it(
    moto_s3: S3Endpoint, bucket: str
) -> None:
    """A file up to single_put_max goes in one request, read from the file as it is sent;
    after a failed attempt the next one starts again from the first byte."""
    with FaultyProxy(moto_s3.url) as proxy:
        storage = S3Storage(bucket, "tier", endpoint_url=proxy.url, part_size=PART)
        data = os.urandom(2 * PART + 7)
        proxy.fail(1, "slowdown", method="PUT")
        storage.upload("one/blob", io.BytesIO(data), len(data))
        assert proxy.count("PUT", None) == 2
    assert read_all(storage, "one/blob") == data
    info = storage.head("one/blob")
    assert info is not None and "-" not in info.checksums["etag"]  # one part: a plain MD5


def test_upload_checks_the_announced_size(storage: S3Storage, raw: S3Client, bucket: str) -> None:
    with pytest.raises(StorageError, match="ended early"):
        storage.upload("s/short", io.BytesIO(b"abc"), 4)
    with pytest.raises(StorageError, match="more than"):
        storage.upload("s/long", io.BytesIO(b"abcde"), 4)
    data = os.urandom(2 * PART + 1)
    with pytest.raises(StorageError, match="ended early"):
        storage.upload("s/short-multipart", io.BytesIO(data), len(data) + 1)
    with pytest.raises(StorageError, match="more than"):
        storage.upload("s/long-multipart", io.BytesIO(data + b"x"), len(data))
    assert not storage.prefix_exists("s")
    assert raw.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted


def test_list_prefix_skips_folder_markers_and_refuses_unsafe_keys(
    storage: S3Storage, raw: S3Client, bucket: str
) -> None:
    raw.put_object(Bucket=bucket, Key="tier/m/", Body=b"")
    raw.put_object(Bucket=bucket, Key="tier/m/d/", Body=b"")
    raw.put_object(Bucket=bucket, Key="tier/m/d/x", Body=b"x")
    assert [info.key for info in storage.list_prefix("m")] == ["d/x"]
    raw.put_object(Bucket=bucket, Key="tier/u/a/../../../escape", Body=b"x")
    with pytest.raises(UnsafePath):
        storage.list_prefix("u")


def test_head_reports_full_object_checksums(storage: S3Storage, raw: S3Client, bucket: str) -> None:
    data = b"checkpoint shard"
    raw.put_object(Bucket=bucket, Key="tier/h/sha", Body=data, ChecksumAlgorithm="SHA256")
    info = storage.head("h/sha")
    assert info is not None
    assert info.checksums["sha256"] == hashlib.sha256(data).hexdigest()
    assert info.checksums["md5"] == hashlib.md5(data).hexdigest()

    crc = google_crc32c.value(data)
    raw.put_object(
        Bucket=bucket,
        Key="tier/h/crc",
        Body=data,
        ChecksumAlgorithm="CRC32C",
        ChecksumCRC32C=base64.b64encode(crc.to_bytes(4, "big")).decode(),
    )
    if "ChecksumCRC32C" not in raw.head_object(
        Bucket=bucket, Key="tier/h/crc", ChecksumMode="ENABLED"
    ):
        pytest.skip("this moto keeps no CRC32C for the object, so there is none to report")
    info = storage.head("h/crc")
    assert info is not None
    assert info.checksums["crc32c"] == f"{crc:08x}"


def test_head_ignores_composite_checksums(storage: S3Storage, raw: S3Client, bucket: str) -> None:
    """moto sends a multipart SHA-256 (a hash of the part hashes) with no "-N" and no
    ChecksumType; it must not pass for the object's SHA-256."""
    key = "tier/h/multipart"
    data = os.urandom(PART + 10)
    upload = raw.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    parts = []
    for number, offset in ((1, 0), (2, PART)):
        part = raw.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=data[offset : offset + PART],
            ChecksumAlgorithm="SHA256",
        )
        parts.append(
            {"PartNumber": number, "ETag": part["ETag"], "ChecksumSHA256": part["ChecksumSHA256"]}
        )
    raw.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
    )
    info = storage.head("h/multipart")
    assert info is not None
    assert "sha256" not in info.checksums
    assert info.checksums["etag"].endswith("-2")


# -- copies and storage classes --------------------------------------------------------------


def test_storage_classes_on_upload_copy_and_in_place(
    moto_s3: S3Endpoint, storage: S3Storage
) -> None:
    def storage_class(key: str) -> str | None:
        info = storage.head(key)
        assert info is not None
        return info.storage_class

    storage.upload("c/a", io.BytesIO(b"a"), 1, storage_class="STANDARD_IA")
    assert storage_class("c/a") == "STANDARD_IA"
    assert storage.list_prefix("c")[0].storage_class == "STANDARD_IA"

    calls = Calls(storage, "CopyObject", "UploadPartCopy")
    storage.copy_within(storage, "c/a", "c/b", 1, storage_class="ONEZONE_IA")
    storage.copy_within(storage, "c/a", "c/plain", 1)
    assert (storage_class("c/b"), storage_class("c/plain")) == ("ONEZONE_IA", "STANDARD")
    assert read_all(storage, "c/b") == b"a"

    storage.set_storage_class("c/a", "GLACIER_IR")
    assert storage_class("c/a") == "GLACIER_IR"
    assert read_all(storage, "c/a") == b"a"
    assert calls["CopyObject"] == 3

    # Nothing to change: S3 would refuse the self-copy, so none is sent.
    storage.set_storage_class("c/a", "GLACIER_IR")
    storage.copy_within(storage, "c/plain", "c/plain", 1)
    assert calls["CopyObject"] == 3

    # Two tiers on one prefix in two classes: a copy between them changes the class.
    cold = S3Storage(storage.bucket, "tier", endpoint_url=moto_s3.url, part_size=PART)
    cold.copy_within(storage, "c/plain", "c/plain", 1, storage_class="STANDARD_IA")
    assert storage_class("c/plain") == "STANDARD_IA"
    assert calls["UploadPartCopy"] == 0

    with pytest.raises(ObjectMissing):
        storage.set_storage_class("c/none", "STANDARD_IA")


def test_copy_within_above_max_single_copy_uses_upload_part_copy(moto_s3: S3Endpoint) -> None:
    source = S3Storage(new_bucket(moto_s3), "src", endpoint_url=moto_s3.url, part_size=PART)
    dest = S3Storage(
        new_bucket(moto_s3),
        "dst",
        endpoint_url=moto_s3.url,
        part_size=PART,
        max_single_copy=6 * MiB,
    )
    assert dest.same_service(source)
    data = os.urandom(12 * MiB)
    source.upload("x.bin", io.BytesIO(data), len(data))
    source.upload("small.bin", io.BytesIO(b"small"), 5)

    calls = Calls(dest, "CopyObject", "UploadPartCopy", "UploadPart", "PutObject", "GetObject")
    dest.copy_within(source, "x.bin", "y.bin", len(data), storage_class="STANDARD_IA")
    assert calls.counts == Counter({"UploadPartCopy": 2})  # two 6 MiB ranges, no bytes through us
    info = dest.head("y.bin")
    assert info is not None
    assert (info.size_bytes, info.storage_class) == (len(data), "STANDARD_IA")
    assert read_all(dest, "y.bin") == data

    dest.copy_within(source, "small.bin", "small.bin", 5)
    assert calls["CopyObject"] == 1
    assert read_all(dest, "small.bin") == b"small"

    with pytest.raises(StorageError, match="holds"):  # the caller's size is checked first
        dest.copy_within(source, "x.bin", "z.bin", len(data) + 1)


def test_set_storage_class_of_a_large_object_copies_in_parts(
    moto_s3: S3Endpoint,
    bucket: str,
) -> None:
    storage = S3Storage(
        bucket, "tier", endpoint_url=moto_s3.url, part_size=PART, max_single_copy=6 * MiB
    )
    data = os.urandom(12 * MiB)
    storage.upload("x.bin", io.BytesIO(data), len(data))
    calls = Calls(storage, "CopyObject", "UploadPartCopy")
    storage.set_storage_class("x.bin", "STANDARD_IA")
    assert calls.counts == Counter({"UploadPartCopy": 2})
    info = storage.head("x.bin")
    assert info is not None
    assert (info.size_bytes, info.storage_class) == (len(data), "STANDARD_IA")
    assert read_all(storage, "x.bin") == data


def test_copy_needs_the_same_service(moto_s3: S3Endpoint, storage: S3Storage) -> None:
    elsewhere = S3Storage(storage.bucket, "tier", endpoint_url="http://127.0.0.1:9")
    aws = S3Storage(storage.bucket, "tier")
    assert not storage.same_service(elsewhere)
    assert not storage.same_service(aws)
    assert storage.same_service(S3Storage("other", endpoint_url=moto_s3.url + "/"))
    with pytest.raises(ValueError, match="server-side"):
        storage.copy_within(elsewhere, "a", "b", 1)


# -- deleting --------------------------------------------------------------------------------


def test_delete_keys_in_batches_of_a_thousand(
    storage: S3Storage, raw: S3Client, bucket: str
) -> None:
    keys = [f"d/{i:04d}" for i in range(2500)]
    for key in keys[::100]:  # 25 exist; the rest are missing, which counts as deleted
        raw.put_object(Bucket=bucket, Key=f"tier/{key}", Body=b"x")
    calls = Calls(storage, "DeleteObjects")
    assert storage.delete_keys(iter(keys)) == 2500
    assert calls["DeleteObjects"] == 3
    assert not storage.prefix_exists("d")
    assert storage.delete_keys(["d/0001", "never/was"]) == 2
    assert storage.delete_keys([]) == 0
    assert calls["DeleteObjects"] == 4


def test_delete_prefix_deletes_pages_while_listing(
    storage: S3Storage, raw: S3Client, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_calls, "LIST_PAGE", 7)  # 30 objects make 5 pages, as 100,000 make 100
    for i in range(30):
        raw.put_object(Bucket=bucket, Key=f"tier/ck/{i % 3}/{i:02d}", Body=b"x")
    for key in ("tier/ck2/keep", "tier/other/keep", "ck/outside-the-tier"):
        raw.put_object(Bucket=bucket, Key=key, Body=b"x")
    calls = Calls(storage, "ListObjectsV2", "DeleteObjects")

    assert storage.delete_prefix("ck") == 30
    assert (calls["ListObjectsV2"], calls["DeleteObjects"]) == (5, 5)
    remaining = {o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert remaining == {"tier/ck2/keep", "tier/other/keep", "ck/outside-the-tier"}
    assert storage.delete_prefix("ck") == 0  # a missing prefix is success
    for root in ("", "/"):
        with pytest.raises(UnsafePath):
            storage.delete_prefix(root)


def test_abort_uploads_under_a_prefix(storage: S3Storage, raw: S3Client, bucket: str) -> None:
    for key in ("tier/ck/a.bin", "tier/ck/sub/b.bin", "tier/ck2/c.bin", "other/d.bin"):
        raw.create_multipart_upload(Bucket=bucket, Key=key)
    assert storage.abort_uploads("ck") == 2
    left = raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert sorted(upload["Key"] for upload in left) == ["other/d.bin", "tier/ck2/c.bin"]
    assert storage.abort_uploads("ck") == 0


# -- archive classes -------------------------------------------------------------------------


def test_glacier_object_is_archived_until_restored(storage: S3Storage) -> None:
    storage.upload("g/cold", io.BytesIO(b"cold"), 4, storage_class="GLACIER")
    with pytest.raises(ArchivedObject):
        storage.open_read("g/cold")
    assert storage.restore_state("g/cold") == "archived"

    storage.request_restore("g/cold", days=2)
    assert storage.restore_state("g/cold") == "readable"  # moto finishes restores at once
    assert read_all(storage, "g/cold") == b"cold"
    storage.request_restore("g/cold")  # repeating it is harmless

    storage.upload("g/warm", io.BytesIO(b"warm"), 4)
    storage.upload("g/instant", io.BytesIO(b"ir"), 2, storage_class="GLACIER_IR")
    calls = Calls(storage, "RestoreObject")
    storage.request_restore("g/warm")  # not archived: nothing to ask for
    storage.request_restore("g/instant")
    assert calls["RestoreObject"] == 0
    assert storage.restore_state("g/warm") == "readable"
    assert storage.restore_state("g/instant") == "readable"
    with pytest.raises(ObjectMissing):
        storage.restore_state("g/none")


# -- checksum modes and S3-compatible servers ------------------------------------------------


@pytest.mark.parametrize("server", ["moto_s3", "rclone_s3"])
def test_when_required_checksums(server: str, request: pytest.FixtureRequest) -> None:
    endpoint: S3Endpoint = request.getfixturevalue(server)
    storage = S3Storage(
        new_bucket(endpoint),
        "tier",
        endpoint_url=endpoint.url,
        request_checksums="when_required",
        part_size=PART,
    )
    data = os.urandom(2 * PART + 7)
    storage.upload("ck/big", io.BytesIO(data), len(data))
    storage.upload("ck/small", io.BytesIO(b"small"), 5)
    assert [info.key for info in storage.list_prefix("ck")] == ["big", "small"]
    assert read_all(storage, "ck/big") == data
    assert storage.delete_keys(["ck/small", "ck/missing"]) == 2
    assert storage.delete_prefix("ck") == 1


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_rclone_smoke(rclone_s3: S3Endpoint, checksums: str) -> None:
    """rclone has no storage classes, UploadPartCopy or restores: none is tried here."""
    storage = S3Storage(
        new_bucket(rclone_s3),
        "tier",
        endpoint_url=rclone_s3.url,
        request_checksums=checksums,
        part_size=PART,
    )
    data = os.urandom(2 * PART + 7)
    storage.upload("ck/big", io.BytesIO(data), len(data))
    storage.upload("ck/sub/small", io.BytesIO(b"small"), 5)
    listed = storage.list_prefix("ck")
    assert [(info.key, info.size_bytes) for info in listed] == [
        ("big", len(data)),
        ("sub/small", 5),
    ]
    info = storage.head("ck/sub/small")
    assert info is not None
    assert info.size_bytes == 5
    assert info.checksums["md5"] == hashlib.md5(b"small").hexdigest()
    assert storage.head("ck/none") is None
    assert read_all(storage, "ck/big") == data

    storage.copy_within(storage, "ck/sub/small", "copy/small", 5)
    assert read_all(storage, "copy/small") == b"small"
    assert storage.abort_uploads("ck") == 0  # rclone lists no uploads as NoSuchUpload
    assert storage.delete_prefix("ck") == 2
    assert not storage.prefix_exists("ck")
    with pytest.raises(ObjectMissing):
        storage.open_read("ck/big")


# -- errors and retries ----------------------------------------------------------------------


def test_missing_bucket_is_an_error_not_a_missing_object(moto_s3: S3Endpoint) -> None:
    storage = S3Storage("no-such-bucket-here", endpoint_url=moto_s3.url)
    with pytest.raises(StorageError, match="NoSuchBucket") as raised:
        storage.list_prefix("ck")
    assert not isinstance(raised.value, ObjectMissing)


def test_unreachable_endpoint_is_transient(instant_backoff: None) -> None:
    dummy_credentials()
    storage = S3Storage("bucket", endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TransientError, match="HeadObject"):
        storage.head("key")


def test_upload_survives_transient_failures(
    proxy: FaultyProxy,
    moto_s3: S3Endpoint,
    instant_backoff: None,
) -> None:
    storage = S3Storage(
        new_bucket(moto_s3),
        "t",
        endpoint_url=proxy.url,
        part_size=PART,
        concurrency=2,
        single_put_max=PART,  # multipart even from a seekable reader
    )
    proxy.fail(2, "slowdown", method="PUT")
    storage.upload("small", io.BytesIO(b"abc"), 3)
    assert proxy.count("PUT") == 3

    proxy.clear()
    proxy.fail(1, "internal", method="POST", query="uploads")  # CreateMultipartUpload
    proxy.fail(1, "throttle", method="PUT", query="partNumber=2")
    proxy.fail(1, "reset", method="POST", query="uploadId")  # CompleteMultipartUpload
    data = os.urandom(2 * PART + 1)
    storage.upload("big", io.BytesIO(data), len(data))
    assert proxy.count("POST", "uploads") == 2
    assert proxy.count("PUT", "partNumber=2") == 2
    assert proxy.count("POST", "uploadId") == 2
    assert read_all(storage, "big") == data

    proxy.fail(1, "reset", method="HEAD")
    assert storage.head("small") is not None
    assert proxy.count("HEAD") == 2

    proxy.fail(1, "truncate", method="GET")
    with storage.open_read("big") as stream, pytest.raises(TransientError, match="GetObject"):
        stream.read()  # a body cut short is worth another try, like a failed request


@pytest.mark.parametrize("server", ["moto_s3", "rclone_s3"])
def test_a_lost_answer_to_a_completed_multipart_upload_is_no_failure(
    server: str, request: pytest.FixtureRequest, instant_backoff: None
) -> None:
    """The server completes the upload but its answer is cut short. Retried, rclone (as S3
    may) says the upload does not exist, because it was completed; moto completes it
    again. Either way the upload succeeds and the object is there whole."""
    endpoint: S3Endpoint = request.getfixturevalue(server)
    with FaultyProxy(endpoint.url) as proxy:
        storage = S3Storage(
            new_bucket(endpoint), "t", endpoint_url=proxy.url, part_size=PART, single_put_max=PART
        )
        proxy.fail(1, "truncate", method="POST", query="uploadId")  # CompleteMultipartUpload
        data = os.urandom(2 * PART + 1)
        storage.upload("big", io.BytesIO(data), len(data))
        assert proxy.count("POST", "uploadId") == 2
        assert read_all(storage, "big") == data
        assert storage.abort_uploads("") == 0


def test_copy_and_delete_survive_transient_failures(
    proxy: FaultyProxy,
    moto_s3: S3Endpoint,
    instant_backoff: None,
) -> None:
    storage = S3Storage(new_bucket(moto_s3), "t", endpoint_url=proxy.url)
    storage.upload("a", io.BytesIO(b"abc"), 3)
    storage.upload("b", io.BytesIO(b"def"), 3)
    proxy.clear()
    proxy.fail(2, "internal", method="PUT")
    storage.copy_within(storage, "a", "copy", 3)
    assert proxy.count("PUT") == 3
    assert read_all(storage, "copy") == b"abc"

    proxy.clear()
    proxy.fail(2, "throttle", method="POST", query="delete")
    proxy.fail(1, "delete-errors", method="POST", query="delete", code="SlowDown")
    assert storage.delete_keys(["a", "b", "copy", "missing"]) == 4
    deletes = [seen for seen in proxy.seen if seen.method == "POST"]
    assert [seen.fault for seen in deletes] == ["throttle", "throttle", "delete-errors", None]
    assert deletes[-1].body.count(b"<Key>") == 1  # only the key reported as failed is retried
    assert not storage.prefix_exists("")


def test_persistent_failures_give_up_after_the_attempts(
    proxy: FaultyProxy,
    moto_s3: S3Endpoint,
    instant_backoff: None,
) -> None:
    storage = S3Storage(new_bucket(moto_s3), "t", endpoint_url=proxy.url)
    proxy.fail(100, "slowdown", method="PUT")
    with pytest.raises(TransientError, match="SlowDown"):
        storage.upload("x", io.BytesIO(b"abc"), 3)
    assert proxy.count("PUT") == retry.ATTEMPTS

    proxy.clear()
    proxy.fail(100, "delete-errors", method="POST", query="delete", code="AccessDenied")
    with pytest.raises(StorageError, match="AccessDenied") as raised:
        storage.delete_keys(["x"])
    assert not raised.value.retryable
    assert proxy.count("POST", "delete") == 1  # not worth another try

    proxy.clear()
    assert storage.head("missing") is None
    assert proxy.count("HEAD") == 1  # a 404 is an answer, not a failure


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-11-30T21:24:18.000Z",  # ListObjectsV2
        "2026-11-30T21:24:18Z",
        "Mon, 30 Nov 2026 21:24:18 GMT",  # HeadObject's Last-Modified header
        "2026-11-30T21:24:18",  # no zone: botocore's parser decides
    ],
)
def test_fast_timestamp_parser_agrees_with_botocore(stamp: str) -> None:
    assert s3_clients._parse_timestamp(stamp) == parse_timestamp(stamp)
