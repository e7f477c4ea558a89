"""Full-object checksums through the API, on moto and fake-gcs-server: a registration by
listing records each provider's full-object checksums (never a composite one), a supplied
`crc64nvme` is validated, stored and returned, and a move between two S3 tiers is verified
against the recorded CRC64NVME without a byte read back; a source whose bytes no longer
match it fails the move and stays."""

from __future__ import annotations

import base64
import functools
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
import google_crc32c
import pytest
from awscrt.checksums import crc64nvme
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from app.settings import Settings
from app.storage import transfer
from tests.builders import (
    assert_problem,
    end_run,
    fetch_checkpoint,
    iso,
    make_executor,
    make_run,
    put_policy,
    register,
    sweep_now,
    with_tiers,
)
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint
from tests.storage.s3_servers import new_bucket as new_s3_bucket

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PART = 5 * 1024 * 1024
MOVE_TO_B = (
    "name: to-b\nrules:\n  - name: now\n    class: milestone\n"
    "    when: {run_ended: 0s}\n    action: {move_to: b}\n"
)


def crc64(data: bytes) -> str:
    return f"{crc64nvme(data):016x}"


def crc32c(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


@dataclass
class Places:
    s3_url: str
    a: str  # S3 buckets of tiers a and b
    b: str
    g: str  # the GCS bucket of tier g
    s3: S3Client  # a training job's clients
    gcs: gcs.Client

    def keys(self, bucket: str) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        return sorted(item["Key"] for item in listed)


@pytest.fixture
def places(moto_s3: S3Endpoint, fake_gcs: GcsEndpoint) -> Places:
    return Places(
        s3_url=moto_s3.url,
        a=new_s3_bucket(moto_s3, "a"),
        b=new_s3_bucket(moto_s3, "b"),
        g=new_gcs_bucket(fake_gcs, "g"),
        s3=boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1"),
        gcs=gcs.Client(credentials=AnonymousCredentials(), project="test"),
    )


@pytest.fixture
def settings(settings: Settings, places: Places) -> Settings:
    """Two S3 tiers that take checksum headers (an endpoint_url alone means they don't)."""
    s3 = {"endpoint_url": places.s3_url, "request_checksums": "when_supported"}
    tiers = [
        {"name": "a", "url": f"s3://{places.a}/ckpt", **s3},
        {"name": "b", "url": f"s3://{places.b}/ckpt", "storage_class": "STANDARD_IA", **s3},
        {"name": "g", "url": f"gs://{places.g}/ckpt"},
    ]
    return with_tiers(settings, tiers)


def in_parts(places: Places, key: str, data: bytes, checksum_type: str) -> None:
    """A job's multipart upload with CRC32C parts."""
    upload = places.s3.create_multipart_upload(
        Bucket=places.a,
        Key=key,
        ChecksumAlgorithm="CRC32C",
        ChecksumType=checksum_type,  # type: ignore[arg-type]
    )
    parts: list[dict[str, Any]] = []
    for number, start in enumerate(range(0, len(data), PART), 1):
        answer = places.s3.upload_part(
            Bucket=places.a,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=data[start : start + PART],
            ChecksumAlgorithm="CRC32C",
        )
        parts.append(
            {
                "PartNumber": number,
                "ETag": answer["ETag"],
                "ChecksumCRC32C": answer["ChecksumCRC32C"],
            }
        )
    places.s3.complete_multipart_upload(
        Bucket=places.a,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
    )


def test_registration_by_listing_records_full_object_checksums(
    client: TestClient, places: Places
) -> None:
    run = make_run(client)
    small, large = os.urandom(2000), os.urandom(PART + 10)
    prefix = "ckpt/p/r/step-1"
    places.s3.put_object(
        Bucket=places.a, Key=f"{prefix}/model.bin", Body=small, ChecksumAlgorithm="CRC64NVME"
    )
    in_parts(places, f"{prefix}/optim.bin", large, "FULL_OBJECT")
    in_parts(places, f"{prefix}/extra.bin", large, "COMPOSITE")
    places.s3.put_object(Bucket=places.a, Key=f"{prefix}/meta.json", Body=b"{}")  # CRC32

    response = register(client, run["id"], 1, f"s3://{places.a}/{prefix}", "final")

    assert response.status_code == 201, response.text
    assert response.json()["files"] == [
        {"path": "extra.bin", "size_bytes": len(large)},  # composite: not recorded
        {"path": "meta.json", "size_bytes": 2},
        {"path": "model.bin", "size_bytes": len(small), "crc64nvme": crc64(small)},
        {"path": "optim.bin", "size_bytes": len(large), "crc32c": crc32c(large)},
    ]
    again = register(client, run["id"], 1, f"s3://{places.a}/{prefix}", "final")
    assert again.status_code == 200, again.text  # the same listing: the same content

    blob = places.gcs.bucket(places.g).blob("ckpt/p/r/step-2/model.bin")
    blob.upload_from_string(small)
    on_gcs = register(client, run["id"], 2, f"gs://{places.g}/ckpt/p/r/step-2", "final")
    assert on_gcs.status_code == 201, on_gcs.text
    assert on_gcs.json()["files"] == [
        {"path": "model.bin", "size_bytes": len(small), "crc32c": crc32c(small)}
    ]


@pytest.mark.parametrize("bad", ["12345", "ABCDEF0123456789", "0123456789abcdef0"])
def test_a_malformed_crc64nvme_is_refused_naming_it(
    client: TestClient, places: Places, bad: str
) -> None:
    run = make_run(client)
    files = [{"path": "model.bin", "size_bytes": 8, "crc64nvme": bad}]
    response = register(client, run["id"], 1, f"s3://{places.a}/ckpt/x", "final", files=files)
    body = assert_problem(response, 422, "files")
    assert "crc64nvme" in body["field"], body


def test_a_supplied_crc64nvme_is_stored_returned_and_compared_on_re_registration(
    client: TestClient, places: Places
) -> None:
    run = make_run(client)
    uri = f"s3://{places.a}/ckpt/p/r/step-3/model.bin"  # one object: nothing is read
    files = [{"path": "model.bin", "size_bytes": 8, "crc64nvme": "0123456789abcdef"}]
    created = register(client, run["id"], 3, uri, "final", files=files)
    assert created.status_code == 201, created.text
    assert fetch_checkpoint(client, created.json()["id"])["files"] == files

    other = [{**files[0], "crc64nvme": "fedcba9876543210"}]
    assert register(client, run["id"], 3, uri, "final", files=other).status_code == 409
    without = [{"path": "model.bin", "size_bytes": 8}]  # left out: no conflict
    assert register(client, run["id"], 3, uri, "final", files=without).status_code == 200


def _at(moment: datetime) -> datetime:
    return moment


def drain(app: FastAPI) -> None:
    """Run workers until nothing is due, their clock past any retry's backoff."""
    later = datetime.now(UTC)
    for _ in range(10):
        later += timedelta(minutes=10)
        if make_executor(app, clock=functools.partial(_at, later)).drain() == 0:
            return


def registered_on_a(client: TestClient, places: Places) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A checkpoint a job wrote to tier a with S3's default CRC64NVME (one file in parts),
    registered by listing an hour ago, in a run that has ended."""
    run = make_run(client)
    files = {"model.bin": os.urandom(2000), "optim.bin": os.urandom(PART + 10)}
    for path, data in files.items():
        places.s3.put_object(
            Bucket=places.a,
            Key=f"ckpt/p/r/step-5/{path}",
            Body=data,
            ChecksumAlgorithm="CRC64NVME",
        )
    response = register(
        client,
        run["id"],
        5,
        f"s3://{places.a}/ckpt/p/r/step-5",
        "milestone",
        created_at=iso(datetime.now(UTC) - timedelta(hours=1)),
    )
    assert response.status_code == 201, response.text
    assert all("crc64nvme" in entry for entry in response.json()["files"])
    put_policy(client, MOVE_TO_B)
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    return response.json(), files


def test_a_move_between_s3_tiers_is_verified_without_reading_a_byte_back(
    client: TestClient, app: FastAPI, places: Places
) -> None:
    checkpoint, files = registered_on_a(client, places)
    (move,) = sweep_now(client)["actions"]
    before = transfer.bytes_through()

    drain(app)

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "done", action
    assert transfer.bytes_through() == before  # server-side, and verified without a read
    body = fetch_checkpoint(client, checkpoint["id"])
    assert [loc["tier"] for loc in body["locations"]] == ["b"]
    copied = places.keys(places.b)  # under <tier>/<project>/<run>/step-5/
    assert sorted(key.rsplit("/", 1)[-1] for key in copied) == sorted(files)
    for key in copied:
        head = places.s3.head_object(Bucket=places.b, Key=key, ChecksumMode="ENABLED")
        data = files[key.rsplit("/", 1)[-1]]
        assert base64.b64decode(head["ChecksumCRC64NVME"]).hex() == crc64(data)
        assert head["StorageClass"] == "STANDARD_IA"
        assert head["ContentLength"] == len(data)


def test_a_source_whose_bytes_left_the_recorded_checksum_fails_the_move(
    client: TestClient, app: FastAPI, places: Places
) -> None:
    checkpoint, files = registered_on_a(client, places)
    other = bytes(b ^ 0xFF for b in files["model.bin"])  # same size, other bytes
    places.s3.put_object(Bucket=places.a, Key="ckpt/p/r/step-5/model.bin", Body=other)
    (move,) = sweep_now(client)["actions"]
    before = transfer.bytes_through()

    drain(app)

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "failed", action
    assert f"crc64nvme {crc64(other)}" in action["error"], action
    assert transfer.bytes_through() == before  # caught without reading the copy
    body = fetch_checkpoint(client, checkpoint["id"])
    assert [loc["tier"] for loc in body["locations"]] == ["a"]
    assert places.keys(places.b) == [], "a bad copy was left behind"
    assert len(places.keys(places.a)) == len(files)
