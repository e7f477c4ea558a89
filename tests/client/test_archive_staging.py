"""Resuming from an archive class: the checkpoint lives on S3 DEEP_ARCHIVE (moto's server),
which no one can read before the provider restores it. The service's restore action asks
the provider and waits; the client only waits for the copy on `hot`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ckpt_client import Client, resume_path
from tests.builders import file_entries, step_files
from tests.client.conftest import ADMIN, Service, serve
from tests.storage.s3_servers import SECRET_KEY, S3Endpoint, new_bucket, s3_client


@pytest.fixture(scope="module")
def bucket(moto_s3: S3Endpoint) -> str:
    return new_bucket(moto_s3, "deep")


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, catalog_url: str, moto_s3: S3Endpoint, bucket: str
) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("service")
    tiers = [
        {"name": "hot", "url": f"file://{root / 'data' / 'hot'}"},
        {
            "name": "deep",
            "url": f"s3://{bucket}/ckpt",
            "storage_class": "DEEP_ARCHIVE",
            "endpoint_url": moto_s3.url,
        },
    ]
    tiers_file = root / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump({"tiers": tiers}))
    yield from serve(root, catalog_url, CKPT_TIERS_FILE=str(tiers_file))


def test_an_archived_checkpoint_is_restored_then_staged_onto_hot(
    service: Service,
    moto_s3: S3Endpoint,
    bucket: str,
    spool_dir: Path,
    project: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = step_files(7, n=3, size=2000)
    prefix = f"ckpt/{project}/run-1/step-7"
    s3 = s3_client(moto_s3)
    for path, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path}", Body=data, StorageClass="DEEP_ARCHIVE")
    caplog.set_level(logging.INFO, logger="ckpt_client")
    with Client(service.url, token=ADMIN, spool_dir=spool_dir) as client:
        run = client.run(project, "run-1")
        archived = run.register(7, f"s3://{bucket}/{prefix}", files=file_entries(files))
        assert archived is not None and archived.tier == "deep" and archived.local_path is None

        point = run.resume_point(stage_to="hot", timeout=120)
        resumed = resume_path(project, "run-1", client=client)

    assert point is not None and point.tier == "deep"
    staged = point.location("hot")
    assert staged is not None and staged.local_path is not None
    assert {
        p.relative_to(staged.local_path).as_posix(): p.read_bytes()
        for p in staged.local_path.rglob("*")
        if p.is_file()
    } == files
    assert resumed == staged.local_path
    lines = [r.getMessage() for r in caplog.records if r.name == "ckpt_client"]
    assert any(line.startswith("staging step 7") and "from deep" in line for line in lines)
    assert any(line.startswith("waiting for step 7") for line in lines), lines
    assert SECRET_KEY not in service.logs()
