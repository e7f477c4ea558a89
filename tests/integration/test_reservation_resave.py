"""A step saved again after its reservation was aborted: a job killed mid-save is restarted,
resumes from an earlier step and reaches the same step again, writing it to the same
place. The new save takes the old reservation back (the step is unique in its run), and
the purge queued for the old save's bytes never touches the new ones."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.db.models import Action
from app.db.session import session_scope
from app.scheduler.runtime import Runtime
from app.services.lifecycle.trash import enqueue_due_purges
from app.settings import Settings
from tests.builders import (
    assert_problem,
    audit_events,
    checkpoint_post,
    fetch_checkpoint,
    file_entries,
    instant,
    ledger,
    make_executor,
    make_run,
    register,
    reserve,
    step_dir,
    tree,
    write_all,
)

TTL = timedelta(minutes=10)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"reservation_ttl": TTL})


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


def abandon(app: FastAPI, reserved: dict[str, Any]) -> Any:
    """The scheduler gives the reservation up and queues the purge of its bytes; returns the
    instant it happened."""
    clock = instant(reserved["reserved_until"]) + timedelta(seconds=1)
    runtime: Runtime = app.state.runtime
    assert runtime.abandon(now=clock) == [reserved["id"]]
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=clock) == 1
    return clock


@pytest.mark.parametrize("committed", [False, True])
def test_saving_an_abandoned_step_again_takes_its_reservation_back(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any], committed: bool
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    clock = abandon(app, reserved)
    files = write_all(data_dir, run, 5)  # the restarted job writes step 5 again

    manifest = file_entries(files) if committed else None
    again = register(client, run["id"], 5, reserved["uri"], committed=committed, files=manifest)

    assert again.status_code == 200, again.text
    body = again.json()
    assert body["id"] == reserved["id"]
    assert body["state"] == ("active" if committed else "writing")
    # the purge queued for the old save is withdrawn: the worker leaves the new bytes alone
    assert make_executor(app, trash_retention=timedelta(0), clock=lambda: clock).drain() == 0
    assert [a["state"] for a in ledger(client, kind="purge")] == ["cancelled"]
    assert tree(step_dir(data_dir, "hot", run, 5)) == files
    if not committed:
        commit = checkpoint_post(client, reserved["id"], "commit", {"files": file_entries(files)})
        assert commit.status_code == 200, commit.text
    final = fetch_checkpoint(client, reserved["id"])
    assert (final["state"], final["size_bytes"]) == ("active", sum(map(len, files.values())))
    trail = [e["event"] for e in audit_events(client, reserved["id"])]
    # reserved, aborted by the scheduler, its purge queued then withdrawn, reserved again
    assert trail == ["reserved", "aborted", "created", "cancelled", "reserved", "committed"]


def test_a_step_whose_aborted_save_was_purged_is_reserved_and_placed_again(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    write_all(data_dir, run, 5)  # the old save's partial bytes, purged below
    clock = abandon(app, reserved)
    assert make_executor(app, trash_retention=timedelta(0), clock=lambda: clock).drain() == 1
    purged = fetch_checkpoint(client, reserved["id"])
    assert (purged["state"], purged["locations"]) == ("deleted", [])

    again = register(client, run["id"], 5, reserved["uri"], committed=False)
    assert again.status_code == 200, again.text
    assert again.json()["state"] == "writing"
    assert [(loc["tier"], loc["role"]) for loc in again.json()["locations"]] == [("hot", "primary")]
    files = write_all(data_dir, run, 5)
    commit = checkpoint_post(client, reserved["id"], "commit")  # the service lists the bytes
    assert commit.status_code == 200, commit.text
    assert commit.json()["state"] == "active"
    assert sorted(f["path"] for f in commit.json()["files"]) == sorted(files)


def test_saving_an_aborted_step_elsewhere_or_as_another_class_is_still_a_conflict(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    assert checkpoint_post(client, reserved["id"], "abort").status_code == 200
    elsewhere = f"file://{step_dir(data_dir, 'hot', run, 6).resolve()}"

    for uri, klass in ((elsewhere, "rolling"), (reserved["uri"], "milestone")):
        refused = register(client, run["id"], 5, uri, klass, committed=False)
        assert_problem(refused, 409, "step")
    assert fetch_checkpoint(client, reserved["id"])["state"] == "trashed"


def test_a_purge_in_progress_refuses_the_new_save_and_changes_nothing(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    abandon(app, reserved)
    with session_scope(app.state.session_factory) as session:  # a worker holds the purge
        session.execute(update(Action).where(Action.kind == "purge").values(state="running"))

    refused = register(client, run["id"], 5, reserved["uri"], committed=False)

    body = assert_problem(refused, 409, "state")
    assert "purged right now" in body["detail"]
    after = fetch_checkpoint(client, reserved["id"])
    assert (after["state"], after["reserved_until"]) == ("trashed", None)
    assert [e["event"] for e in audit_events(client, reserved["id"])].count("reserved") == 1
