"""Reconciliation on S3 (moto) and GCS (fake-gcs-server): orphans found by listing the
buckets, drift from a missing object and from a crc32c the provider reports, orphans deleted
only on request (a fresh object only once its grace period is over)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from app.services.lifecycle.reconcile import delete_orphans
from app.settings import Settings
from app.storage.registry import StorageRegistry
from tests.builders import fetch_checkpoint, make_run, register, with_tiers
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint
from tests.storage.s3_servers import new_bucket as new_s3_bucket

FILES = {"model.bin": b"weights " * 100, "optim.bin": b"moments " * 100}


@pytest.fixture
def places(moto_s3: S3Endpoint, fake_gcs: GcsEndpoint) -> dict[str, Any]:
    return {
        "s3_url": moto_s3.url,
        "s3_bucket": new_s3_bucket(moto_s3, "rec"),
        "gcs_bucket": new_gcs_bucket(fake_gcs, "rec"),
        "s3": boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1"),
        "gcs": gcs.Client(credentials=AnonymousCredentials(), project="test"),
    }


@pytest.fixture
def settings(settings: Settings, data_dir: Path, places: dict[str, Any]) -> Settings:
    tiers = [
        {"name": "hot", "url": f"file://{data_dir / 'hot'}"},
        {
            "name": "cold",
            "url": f"s3://{places['s3_bucket']}/ckpt",
            "storage_class": "STANDARD",
            "endpoint_url": places["s3_url"],
        },
        {"name": "archive", "url": f"gs://{places['gcs_bucket']}/ckpt"},
    ]
    return with_tiers(settings, tiers)


def put_s3(places: dict[str, Any], key: str, data: bytes) -> None:
    places["s3"].put_object(Bucket=places["s3_bucket"], Key=key, Body=data)


def put_gcs(places: dict[str, Any], name: str, data: bytes) -> None:
    places["gcs"].bucket(places["gcs_bucket"]).blob(name).upload_from_string(data)


def listed_checkpoint(client: TestClient, run: dict[str, Any], step: int, uri: str) -> str:
    """Registered without `files`: the service lists the prefix for the manifest."""
    response = register(client, run["id"], step, uri, "milestone")
    assert response.status_code == 201, response.text
    checkpoint_id: str = response.json()["id"]
    return checkpoint_id


def test_orphans_and_drift_on_s3_and_gcs(
    client: TestClient, app: FastAPI, places: dict[str, Any]
) -> None:
    run = make_run(client)
    for name, data in FILES.items():
        put_s3(places, f"ckpt/proj/run-1/step-1/{name}", data)
        put_gcs(places, f"ckpt/proj/run-1/step-2/{name}", data)
        put_gcs(places, f"ckpt/proj/run-1/step-3/{name}", data)
    on_s3 = listed_checkpoint(client, run, 1, f"s3://{places['s3_bucket']}/ckpt/proj/run-1/step-1")
    gs = f"gs://{places['gcs_bucket']}/ckpt/proj/run-1"
    changed = listed_checkpoint(client, run, 2, f"{gs}/step-2")
    whole = listed_checkpoint(client, run, 3, f"{gs}/step-3")
    assert fetch_checkpoint(client, changed)["files"][0]["crc32c"]  # the provider's checksum
    put_s3(places, "ckpt/proj/run-1/step-9/model.bin", b"a crashed purge's")
    put_s3(places, "elsewhere/not-a-tier.bin", b"outside every tier")
    put_gcs(places, "ckpt/tmp/upload.bin", b"abandoned")
    places["s3"].delete_object(Bucket=places["s3_bucket"], Key="ckpt/proj/run-1/step-1/optim.bin")
    put_gcs(places, "ckpt/proj/run-1/step-2/model.bin", b"WEIGHTS " * 100)  # same size

    response = client.get("/v1/reconcile")
    assert response.status_code == 200, response.text
    body = response.json()
    assert {(o["tier"], o["key"], o["uri"]) for o in body["orphans"]} == {
        (
            "cold",
            "proj/run-1/step-9/model.bin",
            f"s3://{places['s3_bucket']}/ckpt/proj/run-1/step-9/model.bin",
        ),
        ("archive", "tmp/upload.bin", f"gs://{places['gcs_bucket']}/ckpt/tmp/upload.bin"),
    }
    drift = {d["checkpoint_id"]: d for d in body["drift"]}
    assert set(drift) == {on_s3, changed}
    assert (drift[on_s3]["tier"], drift[on_s3]["key"], drift[on_s3]["problem"]) == (
        "cold",
        "proj/run-1/step-1/optim.bin",
        "missing",
    )
    assert drift[changed]["problem"].startswith("crc32c: catalogued ")
    assert fetch_checkpoint(client, changed)["health"] == "drift"
    assert fetch_checkpoint(client, whole)["health"] == "ok"

    # Just written: an admin's "delete every orphan" leaves them for now...
    response = client.post("/v1/reconcile/orphans/delete", json={"all": True})
    assert response.json()["deleted"] == []
    assert len(response.json()["refused"]) == 2
    # ...and once old enough (here: no grace) deletes exactly those, nothing catalogued.
    factory, tiers = app.state.session_factory, app.state.tiers
    deleted, refused = delete_orphans(
        factory, tiers, None, storages=StorageRegistry(), now=datetime.now(UTC), grace=timedelta(0)
    )
    assert sorted(o.key for o in deleted) == ["proj/run-1/step-9/model.bin", "tmp/upload.bin"]
    assert refused == []
    remaining = places["s3"].list_objects_v2(Bucket=places["s3_bucket"])["Contents"]
    assert sorted(o["Key"] for o in remaining) == [
        "ckpt/proj/run-1/step-1/model.bin",
        "elsewhere/not-a-tier.bin",
    ]
    names = sorted(b.name for b in places["gcs"].list_blobs(places["gcs_bucket"]))
    assert names == sorted(
        f"ckpt/proj/run-1/step-{step}/{name}" for step in (2, 3) for name in FILES
    )
    assert client.get("/v1/reconcile").json()["orphans"] == []
