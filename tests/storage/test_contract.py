"""One contract, every adapter: local directories, S3 (moto), GCS (fake-gcs-server), and a
smoke run of the same contract on a second S3 implementation (rclone serve s3)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from app.storage.base import Storage, StorageError, join_key
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
    server_side_copy = False  # directories have no server: bytes stream (and get digested)
    default_class = None  # directories have no storage classes: any is taken and ignored
    other_class = "COLDLINE"
    classes_kept = frozenset()
    listings_show_classes = True
    class_change_looks_up = False  # set_storage_class does nothing at all
    restores_look_up = False  # nothing is ever archived on a directory
    archive_class = None
    unfinished_uploads = True  # a crashed upload leaves its `.name.partial-*` file
    fingerprints = frozenset()
    foreign_copy_error = StorageError

    def leave_unfinished(self, storage: Storage, key: str) -> None:
        assert isinstance(storage, LocalStorage)
        target = storage.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_name(f".{target.name}.partial-0123abcd").write_bytes(b"half")

    def foreign(self, tmp_path: Path) -> Storage:
        return S3Storage("bucket", endpoint_url="http://127.0.0.1:9")  # never contacted

    @pytest.fixture
    def make(self, tmp_path: Path) -> Factory:
        counter = iter(range(1000))
        return lambda: LocalStorage(tmp_path / f"root-{next(counter)}")


class S3Contract(StorageContract):
    """What every S3 server here shares (not collected: its name does not start with Test)."""

    server_side_copy = True  # CopyObject between buckets of one endpoint
    default_class = "STANDARD"
    other_class = "STANDARD_IA"
    classes_kept = frozenset({"upload", "copy", "set"})
    listings_show_classes = True
    class_change_looks_up = True
    restores_look_up = True  # restore_state and request_restore send a HeadObject first
    archive_class: ClassVar[str | None] = "GLACIER"
    unfinished_uploads = True  # multipart uploads never completed
    fingerprints = frozenset({"etag", "md5"})  # a single PutObject's ETag is its MD5
    foreign_copy_error = ValueError

    def leave_unfinished(self, storage: Storage, key: str) -> None:
        assert isinstance(storage, S3Storage)
        storage.client.create_multipart_upload(
            Bucket=storage.bucket, Key=join_key(storage.prefix, key)
        )


class TestS3Contract(S3Contract):
    # when_supported: every upload asks S3 for a full-object CRC64NVME
    fingerprints = frozenset({"etag", "md5", "crc64nvme"})

    @pytest.fixture
    def make(self, moto_s3: S3Endpoint) -> Factory:
        return s3_storages(moto_s3, "when_supported")


class TestGcsContract(StorageContract):
    server_side_copy = True  # a rewrite copies between any two buckets
    default_class = "STANDARD"
    other_class = "NEARLINE"
    # fake-gcs-server ignores the destination class of a rewrite (real GCS applies it).
    classes_kept = frozenset({"upload"})
    listings_show_classes = True
    class_change_looks_up = True
    restores_look_up = False  # every class, ARCHIVE included, is read directly
    archive_class = None
    unfinished_uploads = False  # resumable sessions are listed nowhere: nothing to abort
    fingerprints = frozenset({"crc32c", "md5"})
    foreign_copy_error = StorageError

    @pytest.fixture
    def make(self, fake_gcs: GcsEndpoint) -> Factory:
        return lambda: GcsStorage(new_gcs_bucket(fake_gcs), "tier/root", chunk_size=MiB)


class TestRcloneContract(S3Contract):
    """rclone serve s3, as a second S3 implementation: the whole contract as a smoke run."""

    listings_show_classes = False  # HEAD echoes the class an object was sent with; lists do not
    archive_class = None  # rclone keeps no archive: an object sent as GLACIER reads at once

    @pytest.fixture
    def make(self, rclone_s3: S3Endpoint) -> Factory:
        return s3_storages(rclone_s3, "when_required")
