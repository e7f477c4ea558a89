"""The tiers the crash tests run on: local directories, and S3 and GCS served by the test
servers the storage tests start (one of each per test process)."""

from __future__ import annotations

import pytest

from tests.reliability.harness import World, make_world
from tests.storage.gcs_server import GcsEndpoint, anonymous_client
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint, s3_client
from tests.storage.s3_servers import new_bucket as new_s3_bucket


@pytest.fixture(scope="module")
def local_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """`hot` and `cold`, two local directories."""
    return make_world(tmp_path_factory.mktemp("crash-local"))


@pytest.fixture(scope="module")
def object_world(
    tmp_path_factory: pytest.TempPathFactory,
    moto_s3: S3Endpoint,
    fake_gcs: GcsEndpoint,
) -> World:
    """`hot` and `cold` on local directories; `s3` (STANDARD) and `s3ia` (STANDARD_IA) on one
    S3 bucket prefix; `glacier` (GLACIER: restored before it is read) on another bucket;
    `gcs` (ARCHIVE) on GCS."""
    standard, glacier = new_s3_bucket(moto_s3, "std"), new_s3_bucket(moto_s3, "glacier")
    archive = new_gcs_bucket(fake_gcs, "archive")
    s3 = {"endpoint_url": moto_s3.url}
    return make_world(
        tmp_path_factory.mktemp("crash-objects"),
        [
            {"name": "s3", "url": f"s3://{standard}/ckpt", "storage_class": "STANDARD", **s3},
            {"name": "s3ia", "url": f"s3://{standard}/ckpt", "storage_class": "STANDARD_IA", **s3},
            {"name": "glacier", "url": f"s3://{glacier}/ckpt", "storage_class": "GLACIER", **s3},
            {"name": "gcs", "url": f"gs://{archive}/ckpt", "storage_class": "ARCHIVE"},
        ],
        s3=s3_client(moto_s3),
        gcs_client=anonymous_client(fake_gcs.url),
    )
