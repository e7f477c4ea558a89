"""One contract, every adapter: local directories, S3 (moto), GCS (fake-gcs-server), and a
smoke run of the same contract on a second S3 implementation (rclone serve s3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.storage.gcs import GcsStorage
from app.storage.local import LocalStorage
from app.storage.s3 import S3Storage
from tests.storage.contract import Factory, MiB, StorageContract
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint
from tests.storage.s3_servers import new_bucket as new_s3_bucket


def s3_storages(s3: S3Endpoint, request_checksums: str) -> Factory:
    return lambda: S3Storage(
        new_s3_bucket(s3),
        "tier/root",
        endpoint_url=s3.url,
        request_checksums=request_checksums,
        part_size=5 * MiB,
    )


class TestLocalContract(StorageContract):
    @pytest.fixture
    def make(self, tmp_path: Path) -> Factory:
        counter = iter(range(1000))
        return lambda: LocalStorage(tmp_path / f"root-{next(counter)}")


class TestS3Contract(StorageContract):
    @pytest.fixture
    def make(self, moto_s3: S3Endpoint) -> Factory:
        return s3_storages(moto_s3, "when_supported")


class TestGcsContract(StorageContract):
    @pytest.fixture
    def make(self, fake_gcs: GcsEndpoint) -> Factory:
        return lambda: GcsStorage(new_gcs_bucket(fake_gcs), "tier/root", chunk_size=MiB)


class TestRcloneContract(StorageContract):
    """rclone serve s3, as a second S3 implementation: the whole contract as a smoke run."""

    @pytest.fixture
    def make(self, rclone_s3: S3Endpoint) -> Factory:
        return s3_storages(rclone_s3, "when_required")
