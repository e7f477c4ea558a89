"""The lifecycle end to end across providers: `hot` on a local directory, `cold` on S3
(GLACIER_IR), `archive` on GCS (ARCHIVE), `deep` on S3 (DEEP_ARCHIVE, restore first), all
served by real S3 and GCS servers the suite starts itself."""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import google_crc32c
import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs
from mypy_boto3_s3.literals import StorageClassType

from app.settings import Settings
from app.storage import transfer
from tests.builders import (
    assert_problem,
    end_run,
    fetch_checkpoint,
    iso,
    ledger,
    make_executor,
    make_run,
    put_policy,
    register,
    step_dir,
    sweep_now,
    tree,
    with_tiers,
    write_checkpoint,
)
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import SECRET_KEY, S3Endpoint
from tests.storage.s3_servers import new_bucket as new_s3_bucket

DEFAULT_POLICY = (Path(__file__).parents[2] / "policies" / "default.yaml").read_text()


def entries(files: dict[str, bytes]) -> list[dict[str, Any]]:
    """A manifest with both checksums the contract knows."""
    return [
        {
            "path": path,
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "crc32c": google_crc32c.value(data).to_bytes(4, "big").hex(),
        }
        for path, data in sorted(files.items())
    ]


def shards(step: int, n: int = 3, size: int = 3000) -> dict[str, bytes]:
    return {
        f"model/shard-{i}.bin": (f"step {step} shard {i};".encode() * size)[:size] for i in range(n)
    }


class Buckets:
    def __init__(self, s3: S3Endpoint, gs: GcsEndpoint) -> None:
        self.s3_url = s3.url
        self.cold = new_s3_bucket(s3, "cold")
        self.deep = new_s3_bucket(s3, "deep")
        self.archive = new_gcs_bucket(gs, "archive")
        self.s3 = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
        self.gcs = gcs.Client(credentials=AnonymousCredentials(), project="test")

    def s3_objects(self, bucket: str, prefix: str) -> dict[str, tuple[bytes, str]]:
        """key under prefix -> (bytes, storage class)."""
        out: dict[str, tuple[bytes, str]] = {}
        listed = self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
        for item in listed.get("Contents", []):
            key = item["Key"]
            head = self.s3.head_object(Bucket=bucket, Key=key)
            body = b""
            if head.get("StorageClass") not in ("GLACIER", "DEEP_ARCHIVE"):
                body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            rel = key.removeprefix(prefix + "/")
            out[rel] = (body, head.get("StorageClass", "STANDARD"))
        return out

    def gcs_objects(self, bucket: str, prefix: str) -> dict[str, tuple[bytes, str]]:
        out: dict[str, tuple[bytes, str]] = {}
        for listed in self.gcs.list_blobs(bucket, prefix=prefix + "/"):
            blob = self.gcs.bucket(bucket).get_blob(listed.name)  # listings omit the class
            rel, klass = blob.name.removeprefix(prefix + "/"), blob.storage_class
            out[rel] = (blob.download_as_bytes(), klass)
        return out


@pytest.fixture
def buckets(moto_s3: S3Endpoint, fake_gcs: GcsEndpoint) -> Buckets:
    return Buckets(moto_s3, fake_gcs)


@pytest.fixture
def settings(settings: Settings, data_dir: Path, buckets: Buckets) -> Settings:
    tiers = [
        {"name": "hot", "url": f"file://{data_dir / 'hot'}"},
        {"name": "warm", "url": f"file://{data_dir / 'warm'}"},
        {
            "name": "cold",
            "url": f"s3://{buckets.cold}/ckpt",
            "storage_class": "GLACIER_IR",
            "endpoint_url": buckets.s3_url,
        },
        {"name": "archive", "url": f"gs://{buckets.archive}/ckpt", "storage_class": "ARCHIVE"},
        {
            "name": "deep",
            "url": f"s3://{buckets.deep}/ckpt",
            "storage_class": "DEEP_ARCHIVE",
            "endpoint_url": buckets.s3_url,
        },
    ]
    return with_tiers(settings, tiers)


def place(
    client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    step: int,
    klass: str,
    **extra: Any,
) -> dict[str, Any]:
    files = shards(step)
    root = step_dir(data_dir, "hot", run, step)
    uri = write_checkpoint(root.parent, root.name, files)
    response = register(
        client,
        run["id"],
        step,
        uri,
        klass,
        files=entries(files),
        created_at=iso(datetime.now(UTC) - timedelta(hours=1)),
        **extra,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def drain_all(app: FastAPI, *, retention: timedelta = timedelta(0)) -> None:
    """Run workers until nothing is due, even an action waiting a few seconds for a restore."""
    later = datetime.now(UTC)
    for _ in range(10):
        later += timedelta(seconds=31)
        executor = make_executor(
            app, trash_retention=retention, clock=functools.partial(_at, later)
        )
        if executor.drain() == 0:
            return


def test_default_policy_across_local_s3_and_gcs(
    client: TestClient, app: FastAPI, data_dir: Path, buckets: Buckets
) -> None:
    put_policy(client, DEFAULT_POLICY)
    run = make_run(client)
    for step in range(1, 6):
        place(client, data_dir, run, step, "rolling")
    milestones = {
        step: place(client, data_dir, run, step, "milestone", metrics={"eval_loss": 10 - step / 10})
        for step in range(10, 90, 10)
    }
    final = place(client, data_dir, run, 100, "final")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(days=31))

    sweep = sweep_now(client)
    if any(a["state"] == "held" for a in ledger(client)):
        assert client.post(f"/v1/sweeps/{sweep['id']}/approve").status_code == 200
    drain_all(app)

    actions = ledger(client)
    assert actions, "the default policy planned nothing"
    assert {a["state"] for a in actions} == {"done"}, [
        (a["kind"], a["state"], a["error"]) for a in actions
    ]
    # rolling: the last three stay hot, the rest are gone from disk
    for step in range(1, 6):
        assert (step >= 3) == step_dir(data_dir, "hot", run, step).exists()
    # milestones: best 5 by eval_loss plus the last survive and now live on S3 GLACIER_IR
    kept = {40, 50, 60, 70, 80}
    for step, checkpoint in milestones.items():
        body = fetch_checkpoint(client, checkpoint["id"])
        if step not in kept:
            assert body["state"] == "deleted"
            continue
        prefix = f"ckpt/{run['project']}/{run['name']}/step-{step}"
        assert body["state"] == "active"
        assert [(loc["tier"], loc["uri"], loc["storage_class"]) for loc in body["locations"]] == [
            ("cold", f"s3://{buckets.cold}/{prefix}", "GLACIER_IR")
        ]
        assert buckets.s3_objects(buckets.cold, prefix) == {
            path: (data, "GLACIER_IR") for path, data in shards(step).items()
        }
        assert not step_dir(data_dir, "hot", run, step).exists()
    # final: kept hot and copied to the GCS archive, byte for byte, in the ARCHIVE class
    body = fetch_checkpoint(client, final["id"])
    prefix = f"ckpt/{run['project']}/{run['name']}/step-100"
    assert sorted((loc["tier"], loc["role"]) for loc in body["locations"]) == [
        ("archive", "replica"),
        ("hot", "primary"),
    ]
    assert buckets.gcs_objects(buckets.archive, prefix) == {
        path: (data, "ARCHIVE") for path, data in shards(100).items()
    }
    assert tree(step_dir(data_dir, "hot", run, 100)) == shards(100)


def _at(moment: datetime) -> datetime:
    """A clock stopped at `moment`."""
    return moment


def upload_s3(
    buckets: Buckets, bucket: str, prefix: str, files: dict[str, bytes], klass: StorageClassType
) -> None:
    for path, data in files.items():
        buckets.s3.put_object(Bucket=bucket, Key=f"{prefix}/{path}", Body=data, StorageClass=klass)


def test_archive_on_gcs_restores_onto_hot(
    client: TestClient, app: FastAPI, data_dir: Path, buckets: Buckets
) -> None:
    run = make_run(client)
    files = shards(7)
    bucket = buckets.gcs.bucket(buckets.archive)
    for path, data in files.items():
        blob = bucket.blob(f"ckpt/elsewhere/step-7/{path}")
        blob.storage_class = "ARCHIVE"
        blob.upload_from_string(data)
    # no manifest: the service lists the prefix, and takes GCS's crc32c with the sizes
    response = register(
        client, run["id"], 7, f"gs://{buckets.archive}/ckpt/elsewhere/step-7", "final"
    )
    assert response.status_code == 201, response.text
    checkpoint = response.json()
    assert checkpoint["tier"] == "archive"
    assert checkpoint["files"] == [
        {k: v for k, v in e.items() if k != "sha256"} for e in entries(files)
    ]

    restore = client.post(f"/v1/checkpoints/{checkpoint['id']}/restore", json={"tier": "hot"})
    assert restore.status_code == 202, restore.text
    drain_all(app)

    assert client.get(f"/v1/actions/{restore.json()['id']}").json()["state"] == "done"
    body = fetch_checkpoint(client, checkpoint["id"])
    assert sorted((loc["tier"], loc["role"]) for loc in body["locations"]) == [
        ("archive", "primary"),
        ("hot", "replica"),
    ]
    assert tree(step_dir(data_dir, "hot", run, 7)) == files


def test_deep_archive_is_restored_before_it_is_copied(
    client: TestClient, app: FastAPI, data_dir: Path, buckets: Buckets
) -> None:
    run = make_run(client)
    files = shards(9)
    upload_s3(buckets, buckets.deep, "ckpt/old/step-9", files, "DEEP_ARCHIVE")
    response = register(
        client, run["id"], 9, f"s3://{buckets.deep}/ckpt/old/step-9", "final", files=entries(files)
    )
    assert response.status_code == 201, response.text
    checkpoint = response.json()
    action = client.post(f"/v1/checkpoints/{checkpoint['id']}/restore", json={"tier": "hot"}).json()

    # the first attempt only asks for the restore and comes back later; it is no failure
    assert make_executor(app).drain() == 1
    waiting = client.get(f"/v1/actions/{action['id']}").json()
    assert (waiting["state"], waiting["attempts"], waiting["error"]) == ("pending", 0, None)
    assert not step_dir(data_dir, "hot", run, 9).exists()
    head = buckets.s3.head_object(Bucket=buckets.deep, Key="ckpt/old/step-9/model/shard-0.bin")
    assert "Restore" in head, "the restore was never requested"

    drain_all(app)
    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "done"
    assert tree(step_dir(data_dir, "hot", run, 9)) == files
    # the archived original is untouched
    assert set(buckets.s3_objects(buckets.deep, "ckpt/old/step-9")) == set(files)


def test_registering_an_s3_prefix_without_files_lists_it(
    client: TestClient, buckets: Buckets
) -> None:
    run = make_run(client)
    files = shards(3)
    upload_s3(buckets, buckets.cold, "ckpt/p/r/step-3", files, "GLACIER_IR")

    response = register(client, run["id"], 3, f"s3://{buckets.cold}/ckpt/p/r/step-3", "final")

    assert response.status_code == 201, response.text
    body = response.json()
    assert body["files"] == [{"path": p, "size_bytes": len(d)} for p, d in sorted(files.items())]
    assert body["size_bytes"] == sum(len(d) for d in files.values())
    missing = register(client, run["id"], 4, f"s3://{buckets.cold}/ckpt/p/r/step-4", "final")
    assert_problem(missing, 422, "uri")


def test_a_copy_that_does_not_match_the_manifest_keeps_the_source(
    client: TestClient, app: FastAPI, data_dir: Path, buckets: Buckets
) -> None:
    put_policy(
        client,
        "name: to-cold\nrules:\n  - name: now\n    class: milestone\n"
        "    when: {run_ended: 0s}\n    action: {move_to: cold}\n",
    )
    run = make_run(client)
    checkpoint = place(client, data_dir, run, 10, "milestone")
    shard = step_dir(data_dir, "hot", run, 10) / "model" / "shard-1.bin"
    shard.write_bytes(bytes(b ^ 0xFF for b in shard.read_bytes()))  # same size, other bytes
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    (move,) = sweep_now(client)["actions"]

    drain_all(app)

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "failed" and "verification" in action["error"], action
    body = fetch_checkpoint(client, checkpoint["id"])
    assert [loc["tier"] for loc in body["locations"]] == ["hot"]
    assert step_dir(data_dir, "hot", run, 10).exists()
    prefix = f"ckpt/{run['project']}/{run['name']}/step-10"
    assert buckets.s3_objects(buckets.cold, prefix) == {}, "a bad copy was left behind"


@pytest.fixture
def shared_prefix_tiers(
    database_url: str, data_dir: Path, tmp_path: Path, buckets: Buckets
) -> Settings:
    """Two tiers on one bucket prefix in two classes: a move between them is in place."""
    common = {"url": f"s3://{buckets.cold}/shared", "endpoint_url": buckets.s3_url}
    tiers = [
        {"name": "hot", "url": f"file://{data_dir / 'hot'}"},
        {"name": "ia", "storage_class": "STANDARD_IA", **common},
        {"name": "cold", "storage_class": "GLACIER_IR", **common},
    ]
    path = tmp_path / "shared-tiers.yaml"
    path.write_text(yaml.safe_dump({"tiers": tiers}))
    return Settings(
        database_url=database_url,
        data_dir=data_dir,
        tiers_file=path,
        policies_dir=tmp_path / "policies",
        auth="off",
    )


def test_a_class_change_in_place_moves_no_bytes_through_the_service(
    shared_prefix_tiers: Settings, clean_engine: Any, buckets: Buckets
) -> None:
    from app.main import NO_BACKGROUND, create_app

    app = create_app(shared_prefix_tiers, engine=clean_engine, roles=NO_BACKGROUND)
    with TestClient(app) as client:
        put_policy(
            client,
            "name: demote\nrules:\n  - name: now\n    class: milestone\n"
            "    when: {run_ended: 0s}\n    action: {move_to: cold}\n",
        )
        run = make_run(client)
        files = shards(5, size=200_000)
        upload_s3(buckets, buckets.cold, "shared/x/step-5", files, "STANDARD_IA")
        response = register(
            client,
            run["id"],
            5,
            f"s3://{buckets.cold}/shared/x/step-5",
            "milestone",
            files=entries(files),
            created_at=iso(datetime.now(UTC) - timedelta(hours=1)),
        )
        assert response.status_code == 201, response.text
        assert response.json()["tier"] == "ia"
        end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
        (move,) = sweep_now(client)["actions"]
        before = transfer.bytes_through()

        drain_all(app)

        assert transfer.bytes_through() == before
        assert client.get(f"/v1/actions/{move}").json()["state"] == "done"
        body = fetch_checkpoint(client, response.json()["id"])
        assert [(loc["tier"], loc["storage_class"]) for loc in body["locations"]] == [
            ("cold", "GLACIER_IR")
        ]
        assert buckets.s3_objects(buckets.cold, "shared/x/step-5") == {
            path: (data, "GLACIER_IR") for path, data in files.items()
        }


def test_a_slow_restore_is_polled_at_least_every_30_seconds(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    buckets: Buckets,
    moto_s3: S3Endpoint,
) -> None:
    """moto's state manager keeps the restore in progress for a few looks, as S3 would for
    hours: the action waits (no attempt spent) and is polled again within 30 s each time."""
    import httpx
    from sqlalchemy import select

    from app.db.models import Action
    from app.db.session import session_scope

    transition = {
        "model_name": "s3::keyrestore",
        "transition": {"progression": "manual", "times": 6},
    }
    httpx.post(f"{moto_s3.url}/moto-api/state-manager/set-transition", json=transition)
    try:
        run = make_run(client)
        files = shards(11, n=1)
        upload_s3(buckets, buckets.deep, "ckpt/slow/step-11", files, "GLACIER")
        response = register(
            client,
            run["id"],
            11,
            f"s3://{buckets.deep}/ckpt/slow/step-11",
            "final",
            files=entries(files),
        )
        assert response.status_code == 201, response.text
        restore = client.post(
            f"/v1/checkpoints/{response.json()['id']}/restore", json={"tier": "hot"}
        ).json()
        moment = datetime.now(UTC)
        steps: list[str | None] = []
        for _ in range(30):
            make_executor(app, clock=functools.partial(_at, moment)).drain()
            with session_scope(app.state.session_factory) as session:
                action = session.execute(
                    select(Action).where(Action.id == restore["id"])
                ).scalar_one()
                if action.state != "pending":
                    break
                steps.append(action.step)
                assert action.attempts == 0 and action.error is None
                assert timedelta(0) < action.due_at - moment <= timedelta(seconds=30)
                moment = action.due_at
        assert client.get(f"/v1/actions/{restore['id']}").json()["state"] == "done"
        assert steps[:2] == ["restoring/0", "restoring/1"], steps  # still in progress once
        assert tree(step_dir(data_dir, "hot", run, 11)) == files
    finally:
        httpx.post(
            f"{moto_s3.url}/moto-api/state-manager/unset-transition",
            json={"model_name": "s3::keyrestore"},
        )


def test_credentials_never_reach_the_ledger_the_logs_or_the_api(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    buckets: Buckets,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A move into a bucket that does not exist fails with the provider's error; neither
    that error, nor the logs, nor any response carries the keys the client signed with."""
    from tests.storage.s3_servers import ACCESS_KEY

    buckets.s3.delete_bucket(Bucket=buckets.cold)
    put_policy(
        client,
        "name: to-cold\nrules:\n  - name: now\n    class: milestone\n"
        "    when: {run_ended: 0s}\n    action: {move_to: cold}\n",
    )
    run = make_run(client)
    checkpoint = place(client, data_dir, run, 10, "milestone")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    (move,) = sweep_now(client)["actions"]
    caplog.set_level("INFO")

    drain_all(app)

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] in ("pending", "failed") and "NoSuchBucket" in action["error"], action
    assert fetch_checkpoint(client, checkpoint["id"])["tier"] == "hot"
    shown = [caplog.text, str(action), client.get("/v1/tiers").text, str(ledger(client))]
    for secret in (SECRET_KEY, ACCESS_KEY):
        assert not any(secret in text for text in shown)
