"""`ckpt_client.lightning` writing to an object store: Lightning saves `s3://` paths through
fsspec (s3fs) to a real S3 server (moto, as a process), the service lists, keeps and
deletes them there under its policy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.client.conftest import Service, serve
from tests.frameworks.conftest import Training
from tests.frameworks.support import (
    back_date,
    checkpoints,
    poll,
    put_policy,
    run_of,
    sweep_and_settle,
)
from tests.frameworks.test_lightning import SCRIPT, step_file
from tests.storage.s3_servers import S3Endpoint, new_bucket, s3_client


@pytest.fixture(scope="module")
def bucket(moto_s3: S3Endpoint) -> str:
    return new_bucket(moto_s3, "lightning")


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, catalog_url: str, moto_s3: S3Endpoint, bucket: str
) -> Iterator[Service]:
    """`ckpt serve` with a local tier and an S3 one on the moto server."""
    root = tmp_path_factory.mktemp("service")
    tiers = [
        {"name": "hot", "url": f"file://{root / 'data' / 'hot'}"},
        {"name": "remote", "url": f"s3://{bucket}/ckpt", "endpoint_url": moto_s3.url},
    ]
    tiers_file = root / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump({"tiers": tiers}))
    yield from serve(root, catalog_url, CKPT_TIERS_FILE=str(tiers_file), CKPT_TRASH_RETENTION="0s")


def keys(moto_s3: S3Endpoint, bucket: str, prefix: str) -> set[str]:
    listed = s3_client(moto_s3).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {item["Key"].removeprefix(prefix) for item in listed.get("Contents", [])}


def test_checkpoints_written_to_s3_are_catalogued_and_kept_by_the_policy_alone(
    training: Training,
    service: Service,
    project: str,
    catalog_url: str,
    moto_s3: S3Endpoint,
    bucket: str,
) -> None:
    prefix = f"ckpt/{project}/run-1/"
    dirpath = f"s3://{bucket}/{prefix}"
    # the training's s3fs finds the server (and the test servers' keys) in its environment
    endpoint = {"AWS_ENDPOINT_URL": moto_s3.url, "FSSPEC_S3_ENDPOINT_URL": moto_s3.url}
    training.run(SCRIPT, project, "run-1", dirpath, "6", "2", "--async", **endpoint)
    written = {step_file(s) for s in (2, 4, 6)}
    assert keys(moto_s3, bucket, prefix) == written

    with service.admin() as admin:
        run = run_of(admin, project)
        saved = checkpoints(admin, run["id"])
        assert {s: (c["class"], c["state"], c["tier"]) for s, c in saved.items()} == {
            2: ("rolling", "active", "remote"),
            4: ("rolling", "active", "remote"),
            6: ("final", "active", "remote"),
        }
        assert all(c["uri"] == f"{dirpath}{step_file(s)}" for s, c in saved.items())
        assert all(c["size_bytes"] > 0 for c in saved.values())  # listed in the bucket
        put_policy(
            admin,
            project,
            [{"name": "rolling-keep-1", "class": "rolling", "keep_last": 1, "action": "delete"}],
        )
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        poll("step 2 is purged", lambda: checkpoints(admin, run["id"])[2]["state"] == "deleted")
        assert keys(moto_s3, bucket, prefix) == written - {step_file(2)}
