"""A person who undeletes means "keep this": the policy that trashed a checkpoint does not
trash it again for `CKPT_TRASH_RETENTION`, then governs it again; a pin keeps it for good."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.db.models import Checkpoint
from app.db.session import session_scope
from app.settings import Settings
from tests.builders import (
    fetch_checkpoint,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    sweep_now,
)

RETENTION = timedelta(days=3)
AGGRESSIVE = """\
name: aggressive
rules:
  - name: ms-1
    class: milestone
    keep_last: 3
    action: delete
"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"trash_retention": RETENTION})


@pytest.fixture
def trashed(client: TestClient, app: FastAPI, data_dir: Path) -> dict[str, Any]:
    """The oldest of five milestones, trashed by the policy (keep the last 3 of an active
    run: steps 10 and 20 go)."""
    put_policy(client, AGGRESSIVE)
    run = make_run(client, policy="aggressive")
    made = [
        place_checkpoint(client, data_dir, run, step, "milestone") for step in range(10, 60, 10)
    ]
    sweep_now(client)
    make_executor(app, trash_retention=RETENTION).drain()
    assert fetch_checkpoint(client, made[0]["id"])["state"] == "trashed"
    return made[0]


def undelete(client: TestClient, checkpoint_id: str) -> dict[str, Any]:
    response = client.post(f"/v1/checkpoints/{checkpoint_id}/undelete")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def deletes_of(client: TestClient, checkpoint_id: str) -> list[dict[str, Any]]:
    return [a for a in ledger(client, kind="delete") if a["checkpoint_id"] == checkpoint_id]


def test_an_undeleted_checkpoint_is_not_trashed_again_by_its_policy(
    client: TestClient, app: FastAPI, trashed: dict[str, Any]
) -> None:
    before = datetime.now().astimezone()
    back = undelete(client, trashed["id"])

    assert back["state"] == "active"
    until = datetime.fromisoformat(back["protected_until"])
    assert before + RETENTION <= until <= datetime.now().astimezone() + RETENTION
    sweep_now(client)
    make_executor(app, trash_retention=RETENTION).drain()

    assert fetch_checkpoint(client, trashed["id"])["state"] == "active"
    assert len(deletes_of(client, trashed["id"])) == 1  # the first one, nothing since
    plan = client.post("/v1/plan", json={"run_id": trashed["run_id"]}).json()
    (kept,) = [k for k in plan["kept"] if k["checkpoint_id"] == trashed["id"]]
    assert (
        f"protected: undeleted until {until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
        in (kept["reasons"])
    )
    events = client.get("/v1/audit", params={"checkpoint_id": trashed["id"]}).json()["items"]
    assert any(e["event"] == "undeleted" and "protected" in (e["reason"] or "") for e in events)


def test_once_the_protection_ends_the_policy_governs_it_again(
    client: TestClient, app: FastAPI, trashed: dict[str, Any]
) -> None:
    undelete(client, trashed["id"])
    with session_scope(app.state.session_factory) as session:  # the trash period has passed
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.id == trashed["id"])
            .values(protected_until=datetime.now().astimezone() - timedelta(seconds=1))
        )

    sweep_now(client)
    make_executor(app, trash_retention=RETENTION).drain()

    assert fetch_checkpoint(client, trashed["id"])["state"] == "trashed"
    assert len(deletes_of(client, trashed["id"])) == 2


def test_a_pin_keeps_it_after_the_protection_ends(
    client: TestClient, app: FastAPI, trashed: dict[str, Any]
) -> None:
    undelete(client, trashed["id"])
    pinned = client.post(f"/v1/checkpoints/{trashed['id']}/pin", json={"reason": "paper"})
    assert pinned.status_code == 200, pinned.text
    with session_scope(app.state.session_factory) as session:
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.id == trashed["id"])
            .values(protected_until=datetime.now().astimezone() - timedelta(days=1))
        )

    sweep_now(client)
    make_executor(app, trash_retention=RETENTION).drain()

    assert fetch_checkpoint(client, trashed["id"])["state"] == "active"
    assert len(deletes_of(client, trashed["id"])) == 1


def test_undeleting_before_the_delete_ran_protects_it_too(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, AGGRESSIVE)
    run = make_run(client, policy="aggressive")
    made = [
        place_checkpoint(client, data_dir, run, step, "milestone") for step in range(10, 60, 10)
    ]
    sweep_now(client)  # the delete is planned, not yet executed
    back = undelete(client, made[0]["id"])

    assert back["state"] == "active" and back["protected_until"] is not None
    assert {a["state"] for a in deletes_of(client, made[0]["id"])} == {"cancelled"}
    sweep_now(client)
    make_executor(app, trash_retention=RETENTION).drain()
    assert fetch_checkpoint(client, made[0]["id"])["state"] == "active"
