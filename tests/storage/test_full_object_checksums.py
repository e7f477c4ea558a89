"""Full-object checksums: recorded in a manifest by listing, asked for on every upload and
copy the service makes to S3, and used to verify copies without reading them back;
composite checksums and multipart ETags never pass for an object's own.

Against moto's S3 server (with awscrt and crc32c installed, as the dev extra has them)
and `rclone serve s3`; what neither does is tested against S3's own answers, written
down (test_recorded_s3_checksums.py), and GCS in test_gcs_checksums.py. Nothing of ours
is mocked. What the servers lack, found by trying (moto 5.2, rclone 1.75):

- moto lists no `ChecksumType` (AWS lists FULL_OBJECT or COMPOSITE), shows a composite
  value without its "-<parts>", labels a CopyObject of a multipart object COMPOSITE (even
  its CRC64NVME, which S3 defines as full-object only), and answers an UploadPartCopy
  with no part checksum (it computes the whole object's at completion); nor does it
  check a checksum sent with a PutObject or a CompleteMultipartUpload (AWS refuses a
  wrong one with BadDigest): a wrong one is accepted and nothing is kept.
- rclone computes no checksum at all: it keeps the x-amz-checksum-* a PutObject sent,
  unchecked, none for a multipart upload, lists no algorithm, ignores CopyObject's
  ChecksumAlgorithm (the copy keeps the source's), and has no UploadPartCopy.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import google_crc32c
import pytest
from awscrt.checksums import crc64nvme

from app.storage.base import MANIFEST_CHECKSUMS, ObjectInfo, file_entry
from app.storage.limits import MiB
from app.storage.s3 import S3Storage
from app.storage.transfer import bytes_through, copy_files, verify_files
from tests.storage.s3_servers import S3Endpoint, new_bucket, s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.literals import ChecksumAlgorithmType, ChecksumTypeType

PART = 5 * MiB


def crc64(data: bytes) -> str:
    return f"{crc64nvme(data):016x}"


def crc32c(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


def comparable(info: ObjectInfo) -> dict[str, str]:
    """What a manifest would take of an object's checksums."""
    return {n: v for n, v in info.checksums.items() if n in MANIFEST_CHECKSUMS}


def head_comparable(storage: S3Storage, key: str) -> dict[str, str]:
    info = storage.head(key)
    assert info is not None, key
    return comparable(info)


class _Forward(io.RawIOBase):
    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._inner.readinto(buffer)


def forward(data: bytes) -> BinaryIO:
    """A reader that cannot seek (a stream from another provider): uploads go in parts."""
    return io.BufferedReader(_Forward(data))


class Sent:
    """Each operation the storages' clients sent (retries included) and the key it named."""

    def __init__(self, *storages: S3Storage) -> None:
        self.calls: list[tuple[str, str]] = []
        self.headers: list[dict[str, str]] = []  # of each request that writes
        for storage in storages:
            events = storage.client.meta.events
            events.register("provide-client-params.s3", self._params)
            events.register("before-send.s3", self._request)

    def _params(self, params: dict[str, Any], event_name: str, **_: Any) -> None:
        self.calls.append((event_name.rsplit(".", 1)[-1], str(params.get("Key", ""))))

    def _request(self, request: Any, **_: Any) -> None:
        if request.method not in ("GET", "HEAD"):
            self.headers.append({k.lower(): str(v) for k, v in request.headers.items()})

    def keys(self, operation: str) -> list[str]:
        return sorted(key for name, key in self.calls if name == operation)


@pytest.fixture
def raw(moto_s3: S3Endpoint) -> S3Client:
    """Another writer's client (a training job's): it asks for the checksums it is told to."""
    return s3_client(moto_s3)


def s3(endpoint: S3Endpoint, **options: Any) -> S3Storage:
    return S3Storage(
        new_bucket(endpoint),
        "tier",
        endpoint_url=endpoint.url,
        part_size=PART,
        concurrency=4,
        **options,
    )


def written_in_parts(
    raw: S3Client,
    bucket: str,
    key: str,
    data: bytes,
    algorithm: ChecksumAlgorithmType,
    checksum_type: ChecksumTypeType,
) -> None:
    """A multipart upload by another writer, with its parts' checksums."""
    upload = raw.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm=algorithm, ChecksumType=checksum_type
    )
    member = f"Checksum{algorithm}"
    parts: list[dict[str, Any]] = []
    for number, start in enumerate(range(0, len(data), PART), 1):
        answer = raw.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=data[start : start + PART],
            ChecksumAlgorithm=algorithm,
        )
        parts.append({"PartNumber": number, "ETag": answer["ETag"], member: answer[member]})  # type: ignore[literal-required]
    raw.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
    )


# -- S3 (moto): what the service writes ------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "reader"),
    [
        pytest.param(1000, io.BytesIO, id="one-request"),
        pytest.param(PART + 7, io.BytesIO, id="one-streamed-request"),
        pytest.param(2 * PART + 7, forward, id="multipart"),
    ],
)
def test_every_upload_asks_for_a_full_object_crc64nvme(
    moto_s3: S3Endpoint, raw: S3Client, size: int, reader: Callable[[bytes], Any]
) -> None:
    storage = s3(moto_s3)
    data = os.urandom(size)
    storage.upload("ck/a", reader(data), size)

    info = storage.head("ck/a")
    assert info is not None
    assert comparable(info) == {"crc64nvme": crc64(data)}
    if size > 2 * PART:
        answer = raw.head_object(Bucket=storage.bucket, Key="tier/ck/a", ChecksumMode="ENABLED")
        assert answer["ChecksumType"] == "FULL_OBJECT"
        assert info.checksums["etag"].endswith("-3") and "md5" not in info.checksums


@pytest.mark.parametrize("copy", ["CopyObject", "UploadPartCopy"])
def test_a_server_side_copy_gets_the_crc64nvme_of_the_bytes_copied(
    moto_s3: S3Endpoint, raw: S3Client, copy: str
) -> None:
    """The source carries only a composite CRC32C, comparable with nothing; its copy gets
    a CRC64NVME S3 computed from the bytes."""
    source = s3(moto_s3)
    data = os.urandom(2 * PART + 10)
    written_in_parts(raw, source.bucket, "tier/ck/a", data, "CRC32C", "COMPOSITE")
    assert head_comparable(source, "ck/a") == {}
    limit = {"max_single_copy": PART} if copy == "UploadPartCopy" else {}
    dest = s3(moto_s3, **limit)
    sent = Sent(dest)

    dest.copy_within(source, "ck/a", "ck/b", len(data))

    assert [name for name, _ in sent.calls if "Copy" in name] == (
        ["UploadPartCopy"] * 3 if copy == "UploadPartCopy" else ["CopyObject"]
    )
    assert head_comparable(dest, "ck/b") == {"crc64nvme": crc64(data)}


def test_when_required_tiers_ask_for_no_checksum(moto_s3: S3Endpoint) -> None:
    """S3-compatible stores on such a tier may refuse checksum headers they do not know."""
    storage = s3(moto_s3, request_checksums="when_required", max_single_copy=PART)
    sent = Sent(storage)
    small, large = b"small", os.urandom(2 * PART + 7)
    storage.upload("ck/small", io.BytesIO(small), len(small))
    storage.upload("ck/streamed", io.BytesIO(large), len(large))
    storage.upload("ck/parts", forward(large), len(large))
    storage.copy_within(storage, "ck/small", "copy/small", len(small))  # CopyObject
    storage.copy_within(storage, "ck/parts", "copy/parts", len(large))  # UploadPartCopy

    assert {name for name, _ in sent.calls} >= {"PutObject", "UploadPart", "UploadPartCopy"}
    assert {name for headers in sent.headers for name in headers if "checksum" in name} == set()
    assert head_comparable(storage, "ck/small") == head_comparable(storage, "copy/parts") == {}


# -- S3 (moto): what a registration's listing records ------------------------------------------


def test_a_listing_records_full_object_checksums_asking_only_for_objects_with_one(
    moto_s3: S3Endpoint, raw: S3Client
) -> None:
    storage = s3(moto_s3)
    bucket = storage.bucket
    one, two = os.urandom(1000), os.urandom(PART + 10)
    raw.put_object(Bucket=bucket, Key="tier/ck/crc64", Body=one, ChecksumAlgorithm="CRC64NVME")
    raw.put_object(Bucket=bucket, Key="tier/ck/crc32c", Body=one, ChecksumAlgorithm="CRC32C")
    raw.put_object(Bucket=bucket, Key="tier/ck/crc32", Body=one, ChecksumAlgorithm="CRC32")
    raw.put_object(Bucket=bucket, Key="tier/ck/plain", Body=one)
    written_in_parts(raw, bucket, "tier/ck/parts-full", two, "CRC32C", "FULL_OBJECT")
    written_in_parts(raw, bucket, "tier/ck/parts-composite", two, "CRC32C", "COMPOSITE")
    written_in_parts(raw, bucket, "tier/ck/parts-crc64", two, "CRC64NVME", "FULL_OBJECT")
    sent = Sent(storage)

    plain = storage.list_prefix("ck")
    assert sent.keys("HeadObject") == []  # a tier's scan: the listing alone
    assert all(comparable(info) == {} for info in plain)

    listed = {info.key: comparable(info) for info in storage.list_prefix("ck", checksums=True)}
    assert listed == {
        "crc32": {},  # CRC32 is no manifest checksum
        "crc32c": {"crc32c": crc32c(one)},
        "crc64": {"crc64nvme": crc64(one)},
        "parts-composite": {},  # never its composite value
        "parts-crc64": {"crc64nvme": crc64(two)},
        "parts-full": {"crc32c": crc32c(two)},
        "plain": {},
    }
    # moto lists no ChecksumType, so the composite one is asked too (AWS lists it COMPOSITE:
    # see test_aws_listing_types_decide_which_objects_are_asked); never the ones without any
    asked = {key.removeprefix("tier/ck/") for key in sent.keys("HeadObject")}
    assert asked == {"crc32c", "crc64", "parts-composite", "parts-crc64", "parts-full"}


# -- S3 (moto): verifying copies ---------------------------------------------------------------


@pytest.fixture
def registered(moto_s3: S3Endpoint) -> tuple[S3Storage, list[dict[str, Any]], dict[str, bytes]]:
    """A checkpoint the service uploaded (one small file, one in parts) and its manifest as
    a registration lists it."""
    source = s3(moto_s3)
    files = {"model/shard-0": os.urandom(3000), "model/shard-1": os.urandom(2 * PART + 1)}
    for path, data in files.items():
        source.upload(f"ck/{path}", forward(data), len(data))
    manifest = [file_entry(i.key, i) for i in source.list_prefix("ck", checksums=True)]
    assert [set(entry) for entry in manifest] == [{"path", "size_bytes", "crc64nvme"}] * 2
    return source, manifest, files


def test_a_copy_is_verified_against_the_manifest_without_reading_it(
    moto_s3: S3Endpoint,
    registered: tuple[S3Storage, list[dict[str, Any]], dict[str, bytes]],
) -> None:
    source, manifest, files = registered
    dest = s3(moto_s3, max_single_copy=PART)  # the large file by UploadPartCopy
    sent = Sent(source, dest)
    before = bytes_through()

    report = copy_files(source, "ck", dest, "ck", manifest, storage_class="STANDARD_IA")
    problems = verify_files(dest, "ck", manifest, source=source, source_prefix="ck")

    assert problems == []
    assert report.bytes_server_side == sum(len(d) for d in files.values())
    assert sent.keys("GetObject") == [] and bytes_through() == before


def test_a_source_whose_bytes_left_its_manifest_is_caught_without_reading_the_copy(
    moto_s3: S3Endpoint,
    raw: S3Client,
    registered: tuple[S3Storage, list[dict[str, Any]], dict[str, bytes]],
) -> None:
    source, manifest, files = registered
    other = bytes(b ^ 0xFF for b in files["model/shard-0"])  # same size, other bytes
    raw.put_object(Bucket=source.bucket, Key="tier/ck/model/shard-0", Body=other)
    dest = s3(moto_s3)
    sent = Sent(source, dest)

    copy_files(source, "ck", dest, "ck", manifest, storage_class=None)
    problems = verify_files(dest, "ck", manifest, source=source, source_prefix="ck")

    was = crc64(files["model/shard-0"])
    assert problems == [f"ck/model/shard-0 has crc64nvme {crc64(other)}, the manifest says {was}"]
    assert sent.keys("GetObject") == []


def test_without_manifest_checksums_a_copy_still_answers_to_its_sources(
    moto_s3: S3Endpoint,
) -> None:
    """A manifest of sizes only (a local tier's registration): a same-size object already
    at the destination (an earlier attempt's, of other bytes) is not taken for the copy,
    since the two objects' CRC64NVMEs differ; the copy made instead matches its source."""
    source, dest = s3(moto_s3), s3(moto_s3)
    data = os.urandom(3000)
    source.upload("ck/a", io.BytesIO(data), len(data))
    dest.upload("ck/a", io.BytesIO(bytes(b ^ 0xFF for b in data)), len(data))
    manifest = [{"path": "a", "size_bytes": len(data)}]

    report = copy_files(source, "ck", dest, "ck", manifest, storage_class=None)

    assert (report.files, report.skipped) == (1, 0)
    assert verify_files(dest, "ck", manifest, source=source, source_prefix="ck") == []
    assert head_comparable(dest, "ck/a") == {"crc64nvme": crc64(data)}


def test_composite_checksums_and_multipart_etags_never_pass_for_the_objects(
    moto_s3: S3Endpoint, raw: S3Client
) -> None:
    """A job's own manifest (the true CRC32C) for a file it wrote in parts with composite
    CRC32Cs: neither the composite value nor the "-3" ETag is compared with anything (each
    would disagree), so the copy is read back once, the last resort, and passes."""
    source = s3(moto_s3)
    data = os.urandom(2 * PART + 10)
    written_in_parts(raw, source.bucket, "tier/ck/a", data, "CRC32C", "COMPOSITE")
    answer = raw.head_object(Bucket=source.bucket, Key="tier/ck/a", ChecksumMode="ENABLED")
    assert base64.b64decode(answer["ChecksumCRC32C"]).hex() != crc32c(data)
    manifest = [{"path": "a", "size_bytes": len(data), "crc32c": crc32c(data)}]
    dest = s3(moto_s3)
    sent = Sent(source, dest)

    copy_files(source, "ck", dest, "ck", manifest, storage_class=None)
    problems = verify_files(dest, "ck", manifest, source=source, source_prefix="ck")

    assert problems == []
    assert sent.keys("GetObject") == ["tier/ck/a"]  # the destination, read once


# -- rclone serve s3 ---------------------------------------------------------------------------


def test_rclone_keeps_the_checksum_it_was_sent_and_lists_none(rclone_s3: S3Endpoint) -> None:
    """A second implementation: its single-part objects report the CRC64NVME botocore
    computed from the bytes sent; its listings name no algorithm, so a registration there
    asks for nothing and records none, and a multipart object has no checksum but its
    ETag, which rclone makes the MD5 of the whole."""
    storage = s3(rclone_s3)
    small, large = os.urandom(1000), os.urandom(2 * PART + 7)
    storage.upload("ck/small", io.BytesIO(small), len(small))
    storage.upload("ck/large", forward(large), len(large))
    sent = Sent(storage)

    listed = storage.list_prefix("ck", checksums=True)

    assert sent.keys("HeadObject") == []
    assert [comparable(info) for info in listed] == [{}, {}]
    assert head_comparable(storage, "ck/small") == {"crc64nvme": crc64(small)}
    assert head_comparable(storage, "ck/large") == {}
