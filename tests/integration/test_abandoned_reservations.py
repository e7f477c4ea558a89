"""Abandoned reservations: one neither committed nor kept alive by its `reserved_until` is
aborted by the scheduler (actor `system:scheduler`, reason `abandoned`), checked at least
every minute; the job function is driven here with a given clock. A commit and the
scheduler at the same moment never both take effect."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.db.models import Checkpoint
from app.db.session import session_scope
from app.domain.errors import Conflict
from app.scheduler.runtime import ABANDONMENT_PERIOD, PURGE_PERIOD, Runtime
from app.services.catalog import reservations
from app.services.catalog.checkpoints import DEFAULT_RESERVATION_TTL
from app.settings import Settings
from tests.builders import (
    assert_problem,
    audit_events,
    checkpoint_post,
    fetch_checkpoint,
    file_entries,
    instant,
    make_run,
    place_checkpoint,
    reserve,
    write_all,
)

TTL = timedelta(minutes=10)
WEEK = timedelta(days=7)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"reservation_ttl": TTL})


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


# --- abandoned ---------------------------------------------------------------------------------


def test_the_scheduler_aborts_an_abandoned_reservation(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    active = place_checkpoint(client, data_dir, run, 4)
    end = instant(reserved["reserved_until"])
    runtime: Runtime = app.state.runtime

    assert runtime.abandon(now=end - timedelta(seconds=1)) == []  # still alive
    assert fetch_checkpoint(client, reserved["id"])["state"] == "writing"

    assert runtime.abandon(now=end + timedelta(seconds=1)) == [reserved["id"]]

    body = fetch_checkpoint(client, reserved["id"])
    assert (body["state"], body["reserved_until"], body["updated_by"]) == (
        "trashed",
        None,
        "system:scheduler",
    )
    event = audit_events(client, reserved["id"])[-1]
    assert (event["event"], event["actor"], event["reason"]) == (
        "aborted",
        "system:scheduler",
        "abandoned",
    )
    assert fetch_checkpoint(client, active["id"])["state"] == "active"  # rules' business
    assert runtime.abandon(now=end + timedelta(hours=1)) == []  # once
    assert_problem(checkpoint_post(client, reserved["id"], "commit"), 409, "state")


def test_a_kept_alive_reservation_outlives_its_first_end(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    """A save that takes longer than the TTL and keeps its reservation alive is not
    aborted at the first end, and once committed it is no reservation at all."""
    reserved = reserve(client, data_dir, run, 5)
    kept = checkpoint_post(client, reserved["id"], "keepalive").json()
    first_end, new_end = instant(reserved["reserved_until"]), instant(kept["reserved_until"])
    assert new_end > first_end
    runtime: Runtime = app.state.runtime

    assert runtime.abandon(now=first_end + (new_end - first_end) / 2) == []

    files = write_all(data_dir, run, 5)
    assert (
        checkpoint_post(
            client, reserved["id"], "commit", {"files": file_entries(files)}
        ).status_code
        == 200
    )
    assert runtime.abandon(now=new_end + timedelta(days=1)) == []
    assert fetch_checkpoint(client, reserved["id"])["state"] == "active"


def test_a_reservation_past_its_end_still_commits_until_the_scheduler_aborts_it(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    """The scheduler looks every 30 s: a save that finishes in between is not refused."""
    late = reserve(client, data_dir, run, 5)
    kept = reserve(client, data_dir, run, 6)
    with session_scope(app.state.session_factory) as session:  # both ended a minute ago
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.id.in_([late["id"], kept["id"]]))
            .values(reserved_until=datetime.now(UTC) - timedelta(minutes=1))
        )
    files = write_all(data_dir, run, 5)

    committed = checkpoint_post(client, late["id"], "commit", {"files": file_entries(files)})
    renewed = checkpoint_post(client, kept["id"], "keepalive")

    assert committed.status_code == 200, committed.text
    assert renewed.status_code == 200, renewed.text
    assert instant(renewed.json()["reserved_until"]) > datetime.now(UTC)
    runtime: Runtime = app.state.runtime
    assert runtime.abandon(now=datetime.now(UTC)) == []


def test_a_pinned_reservation_is_never_abandoned(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    assert checkpoint_post(client, reserved["id"], "pin", {"reason": "keep"}).status_code == 200
    runtime: Runtime = app.state.runtime
    assert runtime.abandon(now=instant(reserved["reserved_until"]) + timedelta(days=1)) == []
    assert fetch_checkpoint(client, reserved["id"])["state"] == "writing"


def scheduled_every(
    app: FastAPI,
    job_id: str,
    *,
    trash_retention: timedelta = WEEK,
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
) -> timedelta:
    """The interval of the scheduler's job `job_id` in a runtime started with these."""
    runtime = Runtime(
        app.state.session_factory,
        app.state.tiers,
        sweep_interval=timedelta(hours=1),
        trash_retention=trash_retention,
        reservation_ttl=reservation_ttl,
        worker=False,
        evaluator=False,
        scheduler=True,
    )
    runtime.start()
    try:
        assert runtime._scheduler is not None
        job = runtime._scheduler.get_job(job_id)
        assert job is not None
        interval: timedelta = job.trigger.interval
        return interval
    finally:
        runtime.stop()


@pytest.mark.parametrize(
    ("reservation_ttl", "period"),
    [
        (timedelta(minutes=30), ABANDONMENT_PERIOD),  # the default TTL: every 30 s
        (timedelta(seconds=8), timedelta(seconds=2)),  # a short TTL is checked sooner
        (timedelta(seconds=1), timedelta(seconds=1)),  # but never more than once a second
    ],
)
def test_the_scheduler_checks_for_abandoned_reservations_at_least_every_minute(
    app: FastAPI, client: TestClient, reservation_ttl: timedelta, period: timedelta
) -> None:
    assert timedelta(minutes=1) >= ABANDONMENT_PERIOD
    assert scheduled_every(app, "abandon", reservation_ttl=reservation_ttl) == period


@pytest.mark.parametrize(
    ("retention", "period"),
    [
        (timedelta(days=7), PURGE_PERIOD),  # the default retention: every 30 s
        (timedelta(seconds=20), timedelta(seconds=5)),
        (timedelta(0), timedelta(seconds=1)),  # deletes purged within a second or so
    ],
)
def test_the_scheduler_looks_for_due_purges_a_quarter_of_the_retention_at_most_every_30_s(
    app: FastAPI, retention: timedelta, period: timedelta
) -> None:
    assert scheduled_every(app, "purge", trash_retention=retention) == period


def test_a_scheduler_replica_takes_its_ttl_and_import_lease_from_the_settings(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ckpt scheduler` and `ckpt worker` build their runtime from the same variables as
    `ckpt serve`: a replica that looked for lapsed reservations or imports by the defaults
    would take over a live import, or free a step late."""
    from app.cli.common import Catalog
    from app.cli.roles import _runtime

    settings = Settings(reservation_ttl=timedelta(seconds=12), import_lease=timedelta(seconds=9))
    catalog = Catalog(settings, app.state.session_factory, app.state.tiers)
    monkeypatch.setattr("app.cli.roles.configure_logging", lambda *a, **k: None)
    runtime = _runtime(catalog, worker=False, scheduler=True, evaluator=False)

    assert runtime.abandonment_period == timedelta(seconds=3)
    assert runtime.imports.lease == timedelta(seconds=9)


# --- a commit and the scheduler at the same moment ---------------------------------------------


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_reservation_being_committed_is_passed_over_by_the_scheduler(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    reserved = reserve(client, data_dir, run, 5)
    later = instant(reserved["reserved_until"]) + timedelta(seconds=1)
    runtime: Runtime = app.state.runtime
    with app.state.session_factory() as committing:  # holds the row, as a commit does
        committing.execute(
            select(Checkpoint.id).where(Checkpoint.id == reserved["id"]).with_for_update()
        ).all()
        assert runtime.abandon(now=later) == []
        committing.rollback()
    assert runtime.abandon(now=later) == [reserved["id"]]


def race(app: FastAPI, checkpoint_id: str, files: dict[str, bytes], later: datetime) -> bool:
    """A job's commit and the scheduler's abandonment check at once; whether the commit
    took effect (and then the scheduler aborted nothing), checked both ways."""
    runtime: Runtime = app.state.runtime
    start = threading.Barrier(2)

    def commit() -> bool:
        with session_scope(app.state.session_factory) as session:
            start.wait()
            try:
                reservations.commit_checkpoint(
                    session,
                    tiers=app.state.tiers,
                    storages=app.state.storages,
                    checkpoint_id=checkpoint_id,
                    files=file_entries(files),
                    size_bytes=None,
                    metrics=None,
                    actor="job",
                    now=datetime.now(UTC),
                )
            except Conflict:
                return False
            return True

    def abandon() -> list[str]:
        start.wait()
        return runtime.abandon(now=later)

    with ThreadPoolExecutor(2) as pool:
        committed, aborted = pool.submit(commit), pool.submit(abandon)
        won = committed.result(timeout=60)
        lost = aborted.result(timeout=60) == [checkpoint_id]
    assert won != lost, (won, lost)
    return won


def test_a_commit_racing_the_scheduler_takes_effect_or_is_refused_never_both(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    for step in range(1, 7):
        reserved = reserve(client, data_dir, run, step)
        files = write_all(data_dir, run, step)
        later = instant(reserved["reserved_until"]) + timedelta(seconds=1)

        won = race(app, reserved["id"], files, later)

        assert fetch_checkpoint(client, reserved["id"])["state"] == ("active" if won else "trashed")
        trail = [e["event"] for e in audit_events(client, reserved["id"])]
        assert trail == ["reserved", "committed" if won else "aborted"]
