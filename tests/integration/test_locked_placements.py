"""A tier with `object_lock` has what the service places there written locked (final
archives kept for compliance, say), and the catalog knows it: no plan deletes or moves
the checkpoint before the lock ends, and the plan says why. On moto, which keeps Object
Lock retention as S3 does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.session import session_scope
from app.services.lifecycle.planning import plan_catalog
from app.settings import Settings
from tests.builders import (
    end_run,
    fetch_checkpoint,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    sweep_now,
    with_tiers,
)
from tests.storage.s3_servers import S3Endpoint

RETAIN = timedelta(days=30)

ARCHIVE = """\
name: archive-finals
rules:
  - {name: vault, class: final, when: {run_ended: 0s}, action: {move_to: vault}}
"""

DROP = """\
name: archive-finals
rules:
  - {name: drop, class: final, when: {run_ended: 0s}, action: delete}
"""


@pytest.fixture
def vault(moto_s3: S3Endpoint) -> str:
    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
    name = f"vault-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


@pytest.fixture
def settings(settings: Settings, moto_s3: S3Endpoint, vault: str, data_dir: Path) -> Settings:
    tiers: list[dict[str, Any]] = [
        {"name": "hot", "url": f"file://{data_dir / 'hot'}"},
        {
            "name": "vault",
            "url": f"s3://{vault}/ckpt",
            "endpoint_url": moto_s3.url,
            "object_lock": {"mode": "COMPLIANCE", "retain": "30d"},
        },
    ]
    return with_tiers(settings, tiers)


def test_a_placement_on_a_locking_tier_is_written_locked_and_the_plan_waits_for_it(
    client: TestClient, app: FastAPI, data_dir: Path, moto_s3: S3Endpoint, vault: str
) -> None:
    put_policy(client, ARCHIVE)
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 100, "final")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    before = datetime.now(UTC)
    (move,) = sweep_now(client)["actions"]
    make_executor(app).drain()
    after = datetime.now(UTC)

    assert client.get(f"/v1/actions/{move}").json()["state"] == "done"
    record = fetch_checkpoint(client, checkpoint["id"])
    assert record["tier"] == "vault"
    locked_until = datetime.fromisoformat(record["locked_until"])
    assert before + RETAIN <= locked_until <= after + RETAIN
    assert "COMPLIANCE" in record["lock_reason"]

    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
    prefix = f"ckpt/{run['project']}/{run['name']}/step-100/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=vault, Prefix=prefix)["Contents"]]
    assert keys
    for key in keys:
        head = s3.head_object(Bucket=vault, Key=key)
        assert head["ObjectLockMode"] == "COMPLIANCE"
        until = head["ObjectLockRetainUntilDate"]
        assert before + RETAIN - timedelta(seconds=1) <= until <= after + RETAIN

    put_policy(client, DROP)  # the same policy, now deleting finals
    with session_scope(app.state.session_factory) as session:
        now = datetime.now(UTC) + timedelta(minutes=5)
        plan = plan_catalog(session, tiers=app.state.tiers, now=now)
        assert [i.action.checkpoint_id for i in plan.items] == []
        [skipped] = [s for s in plan.skipped if s.checkpoint_id == checkpoint["id"]]
        assert skipped.reason.startswith("delete skipped: the provider keeps it (")
        assert f"{locked_until:%Y-%m-%dT%H:%M:%SZ}" in skipped.reason
        later = plan_catalog(session, tiers=app.state.tiers, now=locked_until + timedelta(1))
        assert [i.action.checkpoint_id for i in later.items] == [checkpoint["id"]]
