"""What real S3 does with full-object checksums that neither moto nor `rclone serve s3`
does (see test_full_object_checksums.py): AWS lists each object's `ChecksumType`, shows a
composite value as "<value>-<parts>", and answers an UploadPartCopy into an upload created
with CRC64NVME with the part's checksum. The adapter and its botocore client run unchanged
against S3's answers as its API reference documents them, served by recorded_s3.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from app.storage.base import MANIFEST_CHECKSUMS
from app.storage.limits import MiB
from app.storage.s3 import S3Storage
from tests.storage.recorded_s3 import Answer, RecordedS3, Request, xml
from tests.storage.s3_servers import dummy_credentials

PART = 5 * MiB
_STAMP = "2025-06-02T10:00:00.000Z"


def _listed(key: str, etag: str, algorithm: str | None, checksum_type: str | None) -> str:
    checksum = f"<ChecksumAlgorithm>{algorithm}</ChecksumAlgorithm>" if algorithm else ""
    checksum += f"<ChecksumType>{checksum_type}</ChecksumType>" if checksum_type else ""
    return (
        f"<Contents><Key>tier/ck/{key}</Key><LastModified>{_STAMP}</LastModified>"
        f"<ETag>&quot;{etag}&quot;</ETag>{checksum}<Size>{3 * PART}</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
    )


# Objects as AWS lists and describes them (its API reference's shapes): a CRC32C of type
# FULL_OBJECT and one COMPOSITE (its value "<base64>-<parts>"), S3's default CRC64NVME, a
# CRC32, and an object older than checksums.
_MULTIPART_ETAG = "0a1b2c3d4e5f60718293a4b5c6d7e8f9-3"
_AWS_OBJECTS = {
    "full.bin": (_MULTIPART_ETAG, "CRC32C", "FULL_OBJECT", {"x-amz-checksum-crc32c": "yZRlqg=="}),
    "composite.bin": (
        _MULTIPART_ETAG,
        "CRC32C",
        "COMPOSITE",
        {"x-amz-checksum-crc32c": "q6aV9A==-3"},
    ),
    "default.bin": (
        "5d41402abc4b2a76b9719d911017c592",
        "CRC64NVME",
        "FULL_OBJECT",
        {"x-amz-checksum-crc64nvme": "AAECAwQFBgc="},
    ),
    "crc32.bin": ("7d793037a0760186574b0282f2f435e7", "CRC32", "FULL_OBJECT", {}),
    "old.bin": ("e4d909c290d0fb1ca068ffaddf22cbd0", None, None, {}),
}


def _aws(request: Request) -> Answer | None:
    if request.method == "GET" and request.query.get("list-type") == "2":
        contents = "".join(
            _listed(key, etag, algorithm, kind)
            for key, (etag, algorithm, kind, _) in sorted(_AWS_OBJECTS.items())
        )
        body = (
            f"<ListBucketResult><Name>bucket</Name><Prefix>tier/ck/</Prefix>"
            f"<KeyCount>{len(_AWS_OBJECTS)}</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
        )
        return Answer(200, {"Content-Type": "application/xml"}, xml(body))
    key = request.path.removeprefix("/bucket/tier/ck/")
    if request.method == "HEAD" and key in _AWS_OBJECTS:
        etag, _, kind, checksum = _AWS_OBJECTS[key]
        headers = {"ETag": f'"{etag}"', "Content-Length": str(3 * PART), **checksum}
        if checksum and request.headers.get("x-amz-checksum-mode") == "ENABLED":
            return Answer(200, {**headers, "x-amz-checksum-type": str(kind)})
        return Answer(200, {k: v for k, v in headers.items() if k in ("ETag", "Content-Length")})
    return None


@pytest.fixture
def aws() -> Iterator[RecordedS3]:
    dummy_credentials()
    with RecordedS3(_aws) as server:
        yield server


def test_aws_listing_types_decide_which_objects_are_asked(aws: RecordedS3) -> None:
    storage = S3Storage("bucket", "tier", endpoint_url=aws.url)

    listed = {
        info.key: {n: v for n, v in info.checksums.items() if n in MANIFEST_CHECKSUMS}
        for info in storage.list_prefix("ck", checksums=True)
    }

    assert listed == {
        "composite.bin": {},
        "crc32.bin": {},
        "default.bin": {"crc64nvme": "0001020304050607"},
        "full.bin": {"crc32c": "c99465aa"},
        "old.bin": {},
    }
    asked = sorted(r.path for r in aws.sent("HEAD"))
    assert asked == ["/bucket/tier/ck/default.bin", "/bucket/tier/ck/full.bin"]
    composite = storage.head("ck/composite.bin")
    assert composite is not None and set(composite.checksums) == {"etag"}  # no MD5 either


def _multipart_copy(request: Request) -> Answer | None:
    """AWS's answers to a multipart copy into an upload created with CRC64NVME: each
    UploadPartCopy's CopyPartResult carries the part's CRC64NVME."""
    if request.method == "HEAD":
        return Answer(
            200, {"ETag": '"5d41402abc4b2a76b9719d911017c592"', "Content-Length": str(3 * PART)}
        )
    if request.method == "POST" and "uploads" in request.query:
        body = (
            "<InitiateMultipartUploadResult><Bucket>bucket</Bucket><Key>tier/ck/b</Key>"
            "<UploadId>up-1</UploadId></InitiateMultipartUploadResult>"
        )
        return Answer(200, {"Content-Type": "application/xml"}, xml(body))
    if request.method == "PUT" and "partNumber" in request.query:
        number = int(request.query["partNumber"])
        value = base64.b64encode(bytes([number] * 8)).decode()
        body = (
            f"<CopyPartResult><LastModified>{_STAMP}</LastModified><ETag>&quot;part{number}&quot;</ETag>"
            f"<ChecksumCRC64NVME>{value}</ChecksumCRC64NVME></CopyPartResult>"
        )
        return Answer(200, {"Content-Type": "application/xml"}, xml(body))
    if request.method == "POST" and "uploadId" in request.query:
        body = (
            "<CompleteMultipartUploadResult><Bucket>bucket</Bucket><Key>tier/ck/b</Key>"
            "<ETag>&quot;0a1b2c3d4e5f60718293a4b5c6d7e8f9-3&quot;</ETag>"
            "<ChecksumCRC64NVME>AAECAwQFBgc=</ChecksumCRC64NVME><ChecksumType>FULL_OBJECT</ChecksumType>"
            "</CompleteMultipartUploadResult>"
        )
        return Answer(200, {"Content-Type": "application/xml"}, xml(body))
    return None


def test_a_multipart_copy_asks_for_a_full_object_crc64nvme_and_lists_aws_part_checksums() -> None:
    dummy_credentials()
    with RecordedS3(_multipart_copy) as server:
        storage = S3Storage(
            "bucket", "tier", endpoint_url=server.url, part_size=PART, max_single_copy=PART
        )
        storage.copy_within(storage, "ck/a", "ck/b", 3 * PART)

    (create,) = server.sent("POST", lambda r: "uploads" in r.query)
    assert create.headers["x-amz-checksum-algorithm"] == "CRC64NVME"
    assert create.headers["x-amz-checksum-type"] == "FULL_OBJECT"
    (complete,) = server.sent("POST", lambda r: "uploadId" in r.query)
    for number in (1, 2, 3):
        value = base64.b64encode(bytes([number] * 8)).decode()
        assert f"<ChecksumCRC64NVME>{value}</ChecksumCRC64NVME>" in complete.body.decode()
