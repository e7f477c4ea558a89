"""What an aborted save left on an object store is purged after the trash period: the
objects under its prefix, the multipart uploads it never finished there, or the one object
its uri names (a save that never committed never said which it was), and nothing of a
neighbour whose key merely starts the same way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.session import session_scope
from app.services.lifecycle.trash import enqueue_due_purges
from app.settings import Settings
from tests.builders import (
    checkpoint_post,
    fetch_checkpoint,
    make_executor,
    make_run,
    register,
    with_tiers,
)
from tests.storage.s3_servers import S3Endpoint, new_bucket

PREFIX = "ckpt/proj/run-1"


@pytest.fixture
def bucket(moto_s3: S3Endpoint) -> str:
    return new_bucket(moto_s3, "resv")


@pytest.fixture
def settings(settings: Settings, moto_s3: S3Endpoint, bucket: str) -> Settings:
    tier = {"name": "hot", "url": f"s3://{bucket}/ckpt", "endpoint_url": moto_s3.url}
    return with_tiers(settings, [tier])


def keys(s3: Any, bucket: str) -> set[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=PREFIX + "/")
    return {item["Key"] for item in listed.get("Contents", [])}


def purge_now(app: FastAPI) -> None:
    with session_scope(app.state.session_factory) as session:
        enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC))
    make_executor(app, trash_retention=timedelta(0)).drain()


def test_an_aborted_saves_objects_and_uploads_are_purged_and_only_those(
    client: TestClient, app: FastAPI, moto_s3: S3Endpoint, bucket: str
) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
    run = make_run(client)
    neighbour_files = {f"{PREFIX}/step-50/model.bin": b"committed weights"}
    for key, data in neighbour_files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    committed = register(client, run["id"], 50, f"s3://{bucket}/{PREFIX}/step-50")
    assert committed.status_code == 201, committed.text
    ids = []
    for step, name in ((5, "step-5"), (6, "last.ckpt")):  # a prefix, then one object
        answer = register(
            client, run["id"], step, f"s3://{bucket}/{PREFIX}/{name}", committed=False
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/step-5/shard-0.bin", Body=b"partial")
    upload = s3.create_multipart_upload(Bucket=bucket, Key=f"{PREFIX}/step-5/shard-1.bin")
    s3.upload_part(
        Bucket=bucket,
        Key=f"{PREFIX}/step-5/shard-1.bin",
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=b"half a shard",
    )
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/last.ckpt", Body=b"half a file")
    for checkpoint_id in ids:
        assert checkpoint_post(client, checkpoint_id, "abort").status_code == 200

    purge_now(app)

    assert [fetch_checkpoint(client, i)["state"] for i in ids] == ["deleted", "deleted"]
    assert keys(s3, bucket) == set(neighbour_files)
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=f"{PREFIX}/")
    assert uploads.get("Uploads", []) == []
    assert fetch_checkpoint(client, committed.json()["id"])["state"] == "active"
