"""Deletes go to the trash: the bytes stay (and are billed) until the trash period ends, a
person can undelete until then, and the purge removes the bytes from every location while
the catalog row stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.session import session_scope
from app.services.lifecycle.trash import enqueue_due_purges
from tests.builders import (
    PROBLEM_JSON,
    ago,
    assert_problem,
    end_run,
    fetch_checkpoint,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    step_dir,
    step_files,
    sweep_now,
    tier_usage,
    tree,
)

WEEK = timedelta(days=7)
POLICY = """\
name: default
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
"""


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


@pytest.fixture
def checkpoint(client: TestClient, data_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    return place_checkpoint(client, data_dir, run, 10)


def delete(client: TestClient, checkpoint_id: str) -> dict[str, Any]:
    response = client.delete(f"/v1/checkpoints/{checkpoint_id}")
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


def enqueue_purges(app: FastAPI, *, retention: timedelta, now: datetime) -> int:
    with session_scope(app.state.session_factory) as session:
        return enqueue_due_purges(session, retention=retention, now=now)


def run_checkpoints(client: TestClient, run_id: str, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"/v1/runs/{run_id}/checkpoints", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


# --- manual delete -> trash ------------------------------------------------------------------


def test_manual_delete_answers_202_with_the_action(
    client: TestClient, checkpoint: dict[str, Any]
) -> None:
    action = delete(client, checkpoint["id"])

    assert action["checkpoint_id"] == checkpoint["id"]
    assert (action["kind"], action["rule"], action["state"]) == ("delete", "manual", "pending")
    assert action["from_tier"] == "hot" and action["to_tier"] is None
    assert action["bytes"] == checkpoint["size_bytes"]
    assert ledger(client) == [action]
    assert delete(client, checkpoint["id"])["id"] == action["id"]  # asked twice: one action
    assert len(ledger(client)) == 1


def test_trashed_checkpoint_keeps_its_bytes_and_is_still_billed(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    usage = tier_usage(client)
    assert usage["hot"] == {"bytes": checkpoint["size_bytes"], "checkpoints": 1}
    action = delete(client, checkpoint["id"])

    assert make_executor(app, trash_retention=WEEK).drain() == 1

    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "done"
    body = fetch_checkpoint(client, checkpoint["id"])
    assert body["state"] == "trashed"
    assert body["locations"] == checkpoint["locations"]
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)
    assert tier_usage(client) == usage
    assert ledger(client, kind="purge") == []
    assert [c["id"] for c in run_checkpoints(client, run["id"], state="trashed")] == [
        checkpoint["id"]
    ]


def test_manual_deletes_are_never_held(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    ckpts = [place_checkpoint(client, data_dir, run, step) for step in range(1, 5)]

    actions = [delete(client, c["id"]) for c in ckpts]

    assert {a["state"] for a in actions} == {"pending"}
    assert make_executor(app).drain() == 4
    assert {fetch_checkpoint(client, c["id"])["state"] for c in ckpts} == {"trashed"}


def test_pinned_checkpoint_cannot_be_deleted(
    client: TestClient, app: FastAPI, data_dir: Path, checkpoint: dict[str, Any]
) -> None:
    pinned = client.post(f"/v1/checkpoints/{checkpoint['id']}/pin", json={"reason": "release"})
    assert pinned.status_code == 200, pinned.text

    response = client.delete(f"/v1/checkpoints/{checkpoint['id']}")

    body = assert_problem(response, 409)
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert "pinned" in body["detail"]
    assert ledger(client) == []
    unpinned = client.delete(f"/v1/checkpoints/{checkpoint['id']}/pin")
    assert unpinned.status_code == 200, unpinned.text
    delete(client, checkpoint["id"])


def test_pinned_after_the_delete_was_asked_is_not_trashed(
    client: TestClient, app: FastAPI, checkpoint: dict[str, Any]
) -> None:
    action = delete(client, checkpoint["id"])
    client.post(f"/v1/checkpoints/{checkpoint['id']}/pin", json={"reason": "changed my mind"})

    make_executor(app).drain()

    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "cancelled"
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "active"


def test_unknown_checkpoint_is_404(client: TestClient) -> None:
    assert_problem(client.delete("/v1/checkpoints/ckp_nothing"), 404)
    assert_problem(client.post("/v1/checkpoints/ckp_nothing/undelete"), 404)


# --- undelete ----------------------------------------------------------------------------------


def test_undelete_brings_a_trashed_checkpoint_back(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    delete(client, checkpoint["id"])
    make_executor(app, trash_retention=WEEK).drain()
    assert_problem(client.delete(f"/v1/checkpoints/{checkpoint['id']}"), 409)

    response = client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete")

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == checkpoint["id"]
    assert body["state"] == "active"
    assert body["locations"] == checkpoint["locations"]
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "active"
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)
    # its trash period is over, but it is no longer in the trash: nothing to purge
    assert enqueue_purges(app, retention=WEEK, now=datetime.now(UTC) + 2 * WEEK) == 0
    again = client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete")
    assert again.status_code == 200 and again.json()["state"] == "active"


def test_undelete_cancels_a_queued_purge(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    delete(client, checkpoint["id"])
    make_executor(app, trash_retention=WEEK).drain()
    later = datetime.now(UTC) + WEEK + timedelta(hours=1)
    assert enqueue_purges(app, retention=WEEK, now=later) == 1
    (purge,) = ledger(client, kind="purge")

    response = client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete")

    assert response.status_code == 200, response.text
    assert client.get(f"/v1/actions/{purge['id']}").json()["state"] == "cancelled"
    assert make_executor(app, trash_retention=WEEK, clock=lambda: later).drain() == 0
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "active"


# --- purge --------------------------------------------------------------------------------------


def test_zero_retention_purges_as_soon_as_the_delete_is_done(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    action = delete(client, checkpoint["id"])

    assert make_executor(app, trash_retention=timedelta(0)).drain() == 2

    (purge,) = ledger(client, kind="purge")
    assert purge["state"] == "done"
    assert purge["rule"] == action["rule"] == "manual"
    assert purge["checkpoint_id"] == checkpoint["id"]
    assert not step_dir(data_dir, "hot", run, 10).exists()
    assert tree(data_dir / "hot") == {}
    body = fetch_checkpoint(client, checkpoint["id"])
    assert body["state"] == "deleted"
    assert body["locations"] == []
    listed = run_checkpoints(client, run["id"])
    assert [(c["id"], c["state"]) for c in listed] == [(checkpoint["id"], "deleted")]
    assert [c["id"] for c in run_checkpoints(client, run["id"], state="deleted")] == [
        checkpoint["id"]
    ]
    assert tier_usage(client)["hot"] == {"bytes": 0, "checkpoints": 0}
    assert_problem(client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete"), 409)
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "deleted"


def test_purge_carries_the_rule_of_a_policy_delete(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    put_policy(client, POLICY)
    old = place_checkpoint(client, data_dir, run, 1)
    place_checkpoint(client, data_dir, run, 2)
    (planned,) = sweep_now(client)["actions"]

    assert make_executor(app, trash_retention=timedelta(0)).drain() == 2

    (delete_action,) = ledger(client, kind="delete")
    (purge,) = ledger(client, kind="purge")
    assert delete_action["id"] == planned
    assert purge["rule"] == delete_action["rule"] == "default/rolling-keep-1"
    assert purge["checkpoint_id"] == old["id"]
    assert fetch_checkpoint(client, old["id"])["state"] == "deleted"
    assert not step_dir(data_dir, "hot", run, 1).exists()
    assert tree(step_dir(data_dir, "hot", run, 2)) == step_files(2)


def test_with_a_week_of_retention_nothing_is_purged_before_it_ends(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    delete(client, checkpoint["id"])
    make_executor(app, trash_retention=WEEK).drain()
    now = datetime.now(UTC)

    assert enqueue_purges(app, retention=WEEK, now=now) == 0
    assert enqueue_purges(app, retention=WEEK, now=now + WEEK - timedelta(hours=1)) == 0
    assert ledger(client, kind="purge") == []
    assert make_executor(app, clock=lambda: now + 2 * WEEK).drain() == 0
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "trashed"

    later = now + WEEK + timedelta(hours=1)
    assert enqueue_purges(app, retention=WEEK, now=later) == 1
    assert enqueue_purges(app, retention=WEEK, now=later) == 0  # already queued
    (purge,) = ledger(client, kind="purge")
    assert (purge["state"], purge["rule"]) == ("pending", "manual")
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)

    assert make_executor(app, trash_retention=WEEK, clock=lambda: later).drain() == 1

    assert client.get(f"/v1/actions/{purge['id']}").json()["state"] == "done"
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "deleted"
    assert not step_dir(data_dir, "hot", run, 10).exists()
    assert_problem(client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete"), 409)


def test_purge_removes_every_location(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    put_policy(client, POLICY)
    final = place_checkpoint(client, data_dir, run, 100, "final")
    end_run(client, run["id"], ago(hours=1))
    sweep_now(client)
    worker = make_executor(app, trash_retention=timedelta(0))
    assert worker.drain() == 1
    assert tree(step_dir(data_dir, "archive", run, 100)) == step_files(100)
    assert len(fetch_checkpoint(client, final["id"])["locations"]) == 2

    delete(client, final["id"])
    assert worker.drain() == 2

    assert fetch_checkpoint(client, final["id"])["state"] == "deleted"
    assert tree(data_dir / "hot") == {}
    assert tree(data_dir / "archive") == {}
    assert tier_usage(client)["archive"] == {"bytes": 0, "checkpoints": 0}


def test_undelete_before_the_worker_ran_withdraws_the_delete(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
) -> None:
    action = delete(client, checkpoint["id"])

    response = client.post(f"/v1/checkpoints/{checkpoint['id']}/undelete")

    assert response.status_code == 200, response.text
    assert response.json()["state"] == "active"
    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "cancelled"
    assert make_executor(app, trash_retention=timedelta(0)).drain() == 0
    assert fetch_checkpoint(client, checkpoint["id"])["state"] == "active"
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)


def test_manual_delete_releases_a_held_policy_delete(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    put_policy(client, POLICY)
    ckpts = [place_checkpoint(client, data_dir, run, step) for step in range(1, 5)]
    held = sweep_now(client)["actions"]
    assert len(held) == 3
    assert {a["state"] for a in ledger(client)} == {"held"}

    action = delete(client, ckpts[0]["id"])

    assert action["id"] in held
    assert action["state"] == "pending"
    assert make_executor(app).drain() == 1
    assert fetch_checkpoint(client, ckpts[0]["id"])["state"] == "trashed"
    assert [fetch_checkpoint(client, c["id"])["state"] for c in ckpts[1:]] == ["active"] * 3
    assert sorted(a["state"] for a in ledger(client)) == ["done", "held", "held"]
