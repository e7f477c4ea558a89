"""A purge means the bytes are gone, on buckets that keep versions and buckets that lock
them (moto implements versioning, Object Lock retention and legal holds as S3 does):
every version goes unless the tier says `keep_versions`; a delete the provider refuses
for a lock fails once, with the date, is not tried again before it, and nothing of the
checkpoint is deleted on a tier that says it locks."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.models import DeletedBytes
from app.db.session import session_scope
from app.services.lifecycle.plan_ledger import replan_after
from app.services.lifecycle.planning import plan_catalog
from app.services.lifecycle.trash import enqueue_due_purges
from app.settings import Settings
from tests.builders import (
    fetch_checkpoint,
    ledger,
    make_executor,
    make_run,
    with_tiers,
)
from tests.builders import register as register_uri
from tests.storage.s3_servers import S3Endpoint

RUN = "ckpt/proj/run-1"


class Bucket:
    """One moto bucket (versioned, and locked when asked) and what it holds."""

    def __init__(self, endpoint: S3Endpoint, *, locked: bool) -> None:
        self.s3: Any = boto3.client("s3", endpoint_url=endpoint.url, region_name="us-east-1")
        self.name = f"v-{uuid.uuid4().hex[:20]}"
        self.s3.create_bucket(Bucket=self.name, ObjectLockEnabledForBucket=locked)
        if not locked:
            self.s3.put_bucket_versioning(
                Bucket=self.name, VersioningConfiguration={"Status": "Enabled"}
            )

    def versions(self, prefix: str = RUN) -> list[tuple[str, bool]]:
        """(key, is a delete marker) of everything stored under `prefix`."""
        page = self.s3.list_object_versions(Bucket=self.name, Prefix=prefix + "/")
        return sorted(
            [(v["Key"], False) for v in page.get("Versions", [])]
            + [(m["Key"], True) for m in page.get("DeleteMarkers", [])]
        )

    def write(self, step: int, **extra: Any) -> str:
        """Two files of one checkpoint, the first written twice (an older version)."""
        base = f"{RUN}/step-{step}"
        self.s3.put_object(Bucket=self.name, Key=f"{base}/model.bin", Body=b"old weights")
        self.s3.put_object(Bucket=self.name, Key=f"{base}/model.bin", Body=b"weights", **extra)
        self.s3.put_object(Bucket=self.name, Key=f"{base}/optim.bin", Body=b"optimizer")
        return f"s3://{self.name}/{base}"


def service_settings(
    settings: Settings, endpoint: S3Endpoint, bucket: Bucket, **tier: Any
) -> Settings:
    hot = {"name": "hot", "url": f"s3://{bucket.name}/ckpt", "endpoint_url": endpoint.url, **tier}
    return with_tiers(settings, [hot])


@pytest.fixture
def bucket(request: pytest.FixtureRequest, moto_s3: S3Endpoint) -> Bucket:
    return Bucket(moto_s3, locked=getattr(request, "param", False))


@pytest.fixture
def tier_options() -> dict[str, Any]:
    return {}


@pytest.fixture
def settings(
    settings: Settings, moto_s3: S3Endpoint, bucket: Bucket, tier_options: dict[str, Any]
) -> Settings:
    return service_settings(settings, moto_s3, bucket, **tier_options)


def register(client: TestClient, run: dict[str, Any], step: int, uri: str) -> dict[str, Any]:
    answer = register_uri(client, run["id"], step, uri, "milestone")
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def delete_and_purge(
    client: TestClient, app: FastAPI, checkpoint_id: str, now: datetime | None = None
) -> None:
    """A manual delete, and the worker through its trash period (0 here) and purge."""
    assert client.delete(f"/v1/checkpoints/{checkpoint_id}").status_code == 202
    clock = (lambda: now) if now is not None else None
    make_executor(app, trash_retention=timedelta(0), clock=clock).drain()


def purges(client: TestClient, checkpoint_id: str) -> list[dict[str, Any]]:
    return [a for a in ledger(client, checkpoint_id=checkpoint_id) if a["kind"] == "purge"]


@pytest.mark.parametrize("tier_options", [{}, {"versioned": True}], ids=["unstated", "stated"])
def test_a_purge_on_a_versioned_bucket_removes_every_version(
    client: TestClient, app: FastAPI, bucket: Bucket
) -> None:
    """Stated or not, the purge leaves no noncurrent version and no delete marker behind
    (before, a plain delete wrote markers and left the bytes billed)."""
    run = make_run(client)
    gone = register(client, run, 1, bucket.write(1))
    kept = register(client, run, 2, bucket.write(2))

    delete_and_purge(client, app, gone["id"])

    assert fetch_checkpoint(client, gone["id"])["state"] == "deleted"
    assert [p["state"] for p in purges(client, gone["id"])] == ["done"]
    assert bucket.versions(f"{RUN}/step-1") == []
    assert fetch_checkpoint(client, kept["id"])["state"] == "active"
    assert bucket.versions(f"{RUN}/step-2") == [
        (f"{RUN}/step-2/model.bin", False),
        (f"{RUN}/step-2/model.bin", False),
        (f"{RUN}/step-2/optim.bin", False),
    ]


@pytest.mark.parametrize(
    "tier_options", [{"versioned": True, "keep_versions": True, "noncurrent_expiry": "30d"}]
)
def test_keep_versions_leaves_the_old_versions_to_the_buckets_lifecycle_and_bills_them(
    client: TestClient, app: FastAPI, bucket: Bucket
) -> None:
    run = make_run(client)
    checkpoint = register(client, run, 1, bucket.write(1))
    tier = client.get("/v1/tiers").json()["items"][0]
    assert tier["provider"]["billed_after_delete"] == "30d"
    assert tier["provider"]["source"] == "tiers file"
    before = datetime.now(UTC)

    delete_and_purge(client, app, checkpoint["id"])

    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "deleted"
    stored = bucket.versions(f"{RUN}/step-1")
    assert [key for key, marker in stored if marker] == [
        f"{RUN}/step-1/model.bin",
        f"{RUN}/step-1/optim.bin",
    ]
    assert len([key for key, marker in stored if not marker]) == 3
    with session_scope(app.state.session_factory) as session:
        [billed] = session.query(DeletedBytes).all()
        assert (billed.checkpoint_id, billed.tier, billed.bytes) == (
            checkpoint["id"],
            "hot",
            checkpoint["size_bytes"],
        )
        assert billed.billed_until is not None
        assert before + timedelta(days=30) <= billed.billed_until
        assert billed.billed_until <= datetime.now(UTC) + timedelta(days=30)
    report = client.get("/v1/reports/cost", params={"group_by": "tier"}).json()
    [row] = [r for r in report["rows"] if r["kind"] == "deleted_billed"]
    assert (row["key"], row["bytes"]) == ("hot", checkpoint["size_bytes"])
    assert report["deleted_billed_bytes"] == checkpoint["size_bytes"]


@pytest.mark.parametrize("bucket", [True], indirect=True)
def test_a_legal_hold_fails_the_purge_once_and_it_waits(
    client: TestClient, app: FastAPI, bucket: Bucket
) -> None:
    """The tier does not say its bucket locks: the plain delete goes, the held version
    refuses, the purge fails at once naming the hold, and no purge is queued again until
    the hold is looked at again; once lifted, the next purge removes everything."""
    run = make_run(client)
    checkpoint = register(client, run, 1, bucket.write(1, ObjectLockLegalHoldStatus="ON"))

    delete_and_purge(client, app, checkpoint["id"])

    [failed] = purges(client, checkpoint["id"])
    assert failed["state"] == "failed" and failed["attempts"] == 1
    assert "legal hold" in failed["error"]
    record = fetch_checkpoint(client, checkpoint["id"])
    assert record["state"] == "trashed" and record["lock_reason"] == "under a legal hold"
    assert (f"{RUN}/step-1/model.bin", False) in bucket.versions(f"{RUN}/step-1")
    locked_until = datetime.fromisoformat(record["locked_until"])
    before_recheck = locked_until - timedelta(minutes=1)
    assert before_recheck > datetime.now(UTC) + replan_after(1)  # the lock, not the backoff
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=before_recheck) == 0

    for version in bucket.s3.list_object_versions(Bucket=bucket.name, Prefix=f"{RUN}/")["Versions"]:
        bucket.s3.put_object_legal_hold(
            Bucket=bucket.name,
            Key=version["Key"],
            VersionId=version["VersionId"],
            LegalHold={"Status": "OFF"},
        )
    later = locked_until + timedelta(seconds=1)
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=later) == 1
    make_executor(app, trash_retention=timedelta(0), clock=lambda: later).drain()

    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "deleted"
    assert bucket.versions(f"{RUN}/step-1") == []


@pytest.mark.parametrize("bucket", [True], indirect=True)
@pytest.mark.parametrize("tier_options", [{"object_lock": {"mode": "GOVERNANCE", "retain": "1d"}}])
def test_retention_refuses_the_whole_purge_and_the_plan_skips_it_until_the_date(
    client: TestClient, app: FastAPI, bucket: Bucket
) -> None:
    """On a tier that says its bucket locks, nothing of the checkpoint is deleted when one
    version is retained: its files stay readable. The failure names the date, the
    checkpoint is skipped by the plan until then, and planned again after it."""
    until = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    run = make_run(client)
    checkpoint = register(
        client,
        run,
        1,
        bucket.write(1, ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until),
    )
    other = register(client, run, 2, bucket.write(2))
    stored = bucket.versions(f"{RUN}/step-1")

    delete_and_purge(client, app, checkpoint["id"])

    [failed] = purges(client, checkpoint["id"])
    assert failed["state"] == "failed" and failed["attempts"] == 1
    assert until.strftime("%Y-%m-%dT%H:%M:%SZ") in failed["error"]
    assert bucket.versions(f"{RUN}/step-1") == stored  # not even a delete marker
    record = fetch_checkpoint(client, checkpoint["id"])
    assert datetime.fromisoformat(record["locked_until"]) == until

    # The plan says why the checkpoint stays, and no purge is queued before the date.
    soon = datetime.now(UTC) + timedelta(minutes=10)
    assert skipped_reasons(app, soon) == {
        checkpoint["id"]: "purge waits: the provider keeps it (retained by Object Lock until "
        f"{until:%Y-%m-%dT%H:%M:%SZ}); tried again after {until:%Y-%m-%dT%H:%M:%SZ}"
    }
    after = until + timedelta(seconds=1)
    assert skipped_reasons(app, after) == {}
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=soon) == 0
        assert enqueue_due_purges(session, retention=timedelta(0), now=after) == 1
    assert fetch_checkpoint(client, other["id"])["state"] == "active"


@pytest.mark.parametrize("bucket", [True], indirect=True)
def test_compliance_retention_fails_once_and_the_purge_succeeds_after_the_date(
    client: TestClient, app: FastAPI, bucket: Bucket
) -> None:
    """COMPLIANCE cannot be shortened by anyone: the purge fails once naming the date,
    nothing is tried again before it, and the first purge after it removes every version
    (the retention here ends a few seconds after the write, and the test waits for it)."""
    until = (datetime.now(UTC) + timedelta(seconds=4)).replace(microsecond=0)
    run = make_run(client)
    checkpoint = register(
        client,
        run,
        1,
        bucket.write(1, ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate=until),
    )

    delete_and_purge(client, app, checkpoint["id"])

    [failed] = purges(client, checkpoint["id"])
    assert failed["state"] == "failed" and failed["attempts"] == 1
    assert f"retained by Object Lock until {until:%Y-%m-%dT%H:%M:%SZ}" in failed["error"]
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC)) == 0

    time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 1)
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC)) == 1
    make_executor(app, trash_retention=timedelta(0)).drain()

    assert sorted(p["state"] for p in purges(client, checkpoint["id"])) == ["done", "failed"]
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "deleted"
    assert bucket.versions(f"{RUN}/step-1") == []


def skipped_reasons(app: FastAPI, now: datetime) -> dict[str, str]:
    with session_scope(app.state.session_factory) as session:
        plan = plan_catalog(session, tiers=app.state.tiers, now=now)
        return {s.checkpoint_id: s.reason for s in plan.skipped}
