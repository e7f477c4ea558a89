"""Reservations, the life of an asynchronous save (DESIGN section 12): a `writing`
checkpoint lives until its `reserved_until`, is kept alive, committed or aborted by its job,
and the partial bytes of an aborted one are purged like a delete's. The scheduler's side
(abandoned reservations) is in test_abandoned_reservations.py, the race with the rolling
prune in test_reservation_race.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

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
    issue_token,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    register,
    reserve,
    step_dir,
    step_files,
    token_client,
    tree,
    write_all,
    write_partial,
)

TTL = timedelta(minutes=10)  # not the default: the setting is what counts
WEEK = timedelta(days=7)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"reservation_ttl": TTL})


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


# --- reserved_until ----------------------------------------------------------------------------


def test_a_reservation_lasts_the_ttl_and_ends_at_its_commit(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    before = datetime.now(UTC)
    reserved = reserve(client, data_dir, run, 5)
    after = datetime.now(UTC)

    assert reserved["state"] == "writing"
    assert before + TTL <= instant(reserved["reserved_until"]) <= after + TTL
    assert fetch_checkpoint(client, reserved["id"])["reserved_until"] == reserved["reserved_until"]
    files = write_all(data_dir, run, 5)

    committed = checkpoint_post(client, reserved["id"], "commit", {"files": file_entries(files)})

    assert committed.status_code == 200, committed.text
    assert committed.json()["state"] == "active"
    assert committed.json()["reserved_until"] is None
    assert fetch_checkpoint(client, reserved["id"])["reserved_until"] is None


def test_a_committed_registration_has_no_reservation(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    assert place_checkpoint(client, data_dir, run, 1)["reserved_until"] is None


def test_keepalive_moves_the_end_of_the_reservation(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    before = datetime.now(UTC)

    kept = checkpoint_post(client, reserved["id"], "keepalive")

    assert kept.status_code == 200, kept.text
    body = kept.json()
    assert body["id"] == reserved["id"] and body["state"] == "writing"
    assert instant(body["reserved_until"]) >= before + TTL
    assert instant(body["reserved_until"]) >= instant(reserved["reserved_until"])
    assert fetch_checkpoint(client, reserved["id"])["reserved_until"] == body["reserved_until"]


def test_keepalive_and_abort_refuse_what_is_not_a_reservation(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    active = place_checkpoint(client, data_dir, run, 1)
    for verb in ("keepalive", "abort"):
        body = assert_problem(checkpoint_post(client, active["id"], verb), 409, "state")
        assert "active" in body["detail"]
        assert_problem(checkpoint_post(client, "ckpt_nope", verb), 404, "checkpoint_id")
    assert fetch_checkpoint(client, active["id"])["state"] == "active"
    assert [e["event"] for e in audit_events(client, active["id"])] == ["registered"]


# --- abort -------------------------------------------------------------------------------------


def test_abort_trashes_the_reservation_and_says_why(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    partial = write_partial(data_dir, run, 5)

    aborted = checkpoint_post(client, reserved["id"], "abort", {"reason": "out of disk"})

    assert aborted.status_code == 200, aborted.text
    body = aborted.json()
    assert (body["state"], body["reserved_until"]) == ("trashed", None)
    assert body["locations"] == reserved["locations"]  # the partial bytes wait for the purge
    assert tree(step_dir(data_dir, "hot", run, 5)) == {"shard-0.bin": partial["shard-0.bin"]}
    event = audit_events(client, reserved["id"])[-1]
    assert (event["event"], event["reason"], event["actor"]) == (
        "aborted",
        "out of disk",
        "anonymous",
    )
    assert (event["before"]["state"], event["after"]["state"]) == ("writing", "trashed")
    # a second abort, a keepalive or a commit of it: it is no reservation any more
    for verb in ("abort", "keepalive", "commit"):
        assert_problem(checkpoint_post(client, reserved["id"], verb), 409, "state")


def test_abort_without_a_body_or_reason(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    assert checkpoint_post(client, reserved["id"], "abort").json()["state"] == "trashed"
    assert audit_events(client, reserved["id"])[-1]["reason"] is None


def test_abort_refuses_bad_input_and_a_pinned_reservation(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    assert_problem(
        checkpoint_post(client, reserved["id"], "abort", {"reason": "x", "force": True}),
        422,
        "force",
    )
    assert_problem(checkpoint_post(client, reserved["id"], "abort", {"reason": 5}), 422, "reason")
    assert_problem(checkpoint_post(client, reserved["id"], "abort", {"reason": ""}), 422, "reason")
    pinned = checkpoint_post(client, reserved["id"], "pin", {"reason": "the one for the paper"})
    assert pinned.status_code == 200, pinned.text

    assert_problem(checkpoint_post(client, reserved["id"], "abort"), 409, "pinned")

    assert fetch_checkpoint(client, reserved["id"])["state"] == "writing"


def test_the_partial_bytes_of_an_aborted_save_are_purged_after_the_trash_period(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    write_partial(data_dir, run, 5)
    kept = place_checkpoint(client, data_dir, run, 4)
    assert checkpoint_post(client, reserved["id"], "abort").status_code == 200
    factory = app.state.session_factory

    now = datetime.now(UTC)
    with session_scope(factory) as session:  # within the trash period: nothing
        assert enqueue_due_purges(session, retention=WEEK, now=now) == 0
    later = now + WEEK + timedelta(seconds=1)
    with session_scope(factory) as session:
        assert enqueue_due_purges(session, retention=WEEK, now=later) == 1
    assert make_executor(app, trash_retention=WEEK, clock=lambda: later).drain() == 1

    gone = fetch_checkpoint(client, reserved["id"])
    assert (gone["state"], gone["locations"]) == ("deleted", [])
    assert not step_dir(data_dir, "hot", run, 5).exists()
    assert tree(step_dir(data_dir, "hot", run, 4)) == step_files(4)  # its neighbour untouched
    assert fetch_checkpoint(client, kept["id"])["state"] == "active"
    assert "purged" in [e["event"] for e in audit_events(client, reserved["id"])]


# --- undelete ----------------------------------------------------------------------------------


def test_undelete_of_an_aborted_reservation_brings_it_back_writing(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    runtime: Runtime = app.state.runtime
    clock = instant(reserved["reserved_until"]) + timedelta(seconds=1)
    assert runtime.abandon(now=clock) == [reserved["id"]]
    with session_scope(app.state.session_factory) as session:  # its purge is queued
        assert enqueue_due_purges(session, retention=timedelta(0), now=clock) == 1
    before = datetime.now(UTC)

    back = checkpoint_post(client, reserved["id"], "undelete")

    assert back.status_code == 200, back.text
    body = back.json()
    assert body["state"] == "writing"  # not active: nobody said its bytes are complete
    assert instant(body["reserved_until"]) >= before + TTL
    assert body["protected_until"] is None
    # the purge queued for it is withdrawn: the worker leaves its bytes alone
    files = write_all(data_dir, run, 5)
    assert make_executor(app, trash_retention=timedelta(0), clock=lambda: clock).drain() == 0
    assert [a["state"] for a in ledger(client, kind="purge")] == ["cancelled"]
    assert tree(step_dir(data_dir, "hot", run, 5)) == files
    committed = checkpoint_post(client, reserved["id"], "commit", {"files": file_entries(files)})
    assert committed.status_code == 200, committed.text
    assert committed.json()["state"] == "active"


def test_undelete_of_a_committed_checkpoint_still_brings_it_back_active(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    checkpoint = place_checkpoint(client, data_dir, run, 1)
    assert client.delete(f"/v1/checkpoints/{checkpoint['id']}").status_code == 202
    make_executor(app, trash_retention=WEEK).drain()
    back = checkpoint_post(client, checkpoint["id"], "undelete").json()
    assert (back["state"], back["reserved_until"]) == ("active", None)


def test_a_reservation_deleted_by_hand_is_a_reservation_again_after_undelete(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    assert client.delete(f"/v1/checkpoints/{reserved['id']}").status_code == 202
    make_executor(app, trash_retention=WEEK).drain()
    trashed = fetch_checkpoint(client, reserved["id"])
    assert (trashed["state"], trashed["reserved_until"]) == ("trashed", None)

    assert checkpoint_post(client, reserved["id"], "undelete").json()["state"] == "writing"


# --- registering the same step again -------------------------------------------------------------


def test_the_same_reservation_again_answers_200_and_renews_it(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)

    again = register(client, run["id"], 5, reserved["uri"], committed=False)

    assert again.status_code == 200, again.text
    assert again.json()["id"] == reserved["id"] and again.json()["state"] == "writing"
    assert instant(again.json()["reserved_until"]) >= instant(reserved["reserved_until"])
    other_uri = f"file://{step_dir(data_dir, 'hot', run, 6).resolve()}"
    assert_problem(register(client, run["id"], 5, other_uri, committed=False), 409, "step")


def test_a_reservation_of_a_committed_step_answers_the_checkpoint(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    active = place_checkpoint(client, data_dir, run, 1)
    again = register(client, run["id"], 1, active["uri"], committed=False)
    assert again.status_code == 200, again.text
    assert (again.json()["state"], again.json()["reserved_until"]) == ("active", None)


def test_a_committed_registration_of_a_reserved_step_commits_it(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    files = write_all(data_dir, run, 5)
    again = register(client, run["id"], 5, reserved["uri"], files=file_entries(files))
    assert again.status_code == 200, again.text
    assert (again.json()["state"], again.json()["reserved_until"]) == ("active", None)


# --- access control ----------------------------------------------------------------------------


def test_commit_keepalive_and_abort_need_register_on_the_project(
    auth_app: FastAPI, auth_client: TestClient, admin_client: TestClient, data_dir: Path
) -> None:
    run = make_run(admin_client, project="llama")
    _, job = issue_token(auth_app, name="job", scopes=("register",), projects=("llama",))
    _, reader = issue_token(auth_app, name="reader", scopes=("read",), projects=("*",))
    _, stranger = issue_token(auth_app, name="other", scopes=("register",), projects=("gpt",))
    as_job = token_client(auth_app, job)
    ids = [reserve(as_job, data_dir, run, step)["id"] for step in (1, 2)]

    for verb in ("keepalive", "abort", "commit"):
        assert_problem(auth_client.post(f"/v1/checkpoints/{ids[0]}/{verb}"), 401)
        for secret in (reader, stranger):
            refused = token_client(auth_app, secret).post(f"/v1/checkpoints/{ids[0]}/{verb}")
            assert_problem(refused, 403)
    assert fetch_checkpoint(admin_client, ids[0])["state"] == "writing"  # nothing happened

    assert as_job.post(f"/v1/checkpoints/{ids[0]}/keepalive").status_code == 200
    aborted = as_job.post(f"/v1/checkpoints/{ids[0]}/abort", json={"reason": "preempted"})
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["updated_by"].endswith(":job")
    files = write_all(data_dir, run, 2)
    committed = as_job.post(f"/v1/checkpoints/{ids[1]}/commit", json={"files": file_entries(files)})
    assert committed.status_code == 200, committed.text
