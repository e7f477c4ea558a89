"""A large plan split by runs across processes is the plan one process makes: the same
actions in the same states (the blast-radius hold weighed over a project's runs in every
range), the same kept and skipped checkpoints, the same next due times and totals. A
helper that dies or is missing costs time, never the plan."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import orjson
import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from sqlalchemy import Engine, insert

from app.db.models import Checkpoint, Location, Project, Run
from app.db.session import session_scope
from app.domain.plan import Kept
from app.main import NO_BACKGROUND, create_app
from app.policy.loading import validate_policy
from app.services.catalog.policies import store_policy
from app.services.lifecycle import plan_helpers
from app.services.lifecycle.planning import CatalogPlan, plan_catalog
from app.services.lifecycle.sweep import run_sweep
from app.settings import Settings
from tests.builders import active_checkpoint_rows
from tests.conftest import empty

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)

POLICY = """\
name: default
rules:
  - {name: rolling, class: rolling, keep_last: 2, action: delete}
  - {name: thin, class: milestone, when: {run_ended: 2d}, keep_last: 1, action: delete}
  - {name: cool, class: milestone, when: {age: 10d}, action: {move_to: cold}}
  - {name: archive, class: final, when: {run_ended: 0s}, action: {copy_to: archive}}
"""

WHAT_IF = """\
name: what-if
rules:
  - {name: rolling, class: rolling, keep_last: 1, action: delete}
  - {name: cold, class: milestone, when: {age: 5d}, action: {move_to: cold}}
"""


@dataclass(frozen=True)
class RunShape:
    project: int
    ended_days_ago: int | None  # None: still active
    checkpoints: tuple[tuple[str, int, int], ...]  # (class, age in days, size)


runs_shape = st.builds(
    RunShape,
    project=st.integers(0, 2),
    ended_days_ago=st.one_of(st.none(), st.integers(0, 40)),
    checkpoints=st.lists(
        st.tuples(
            st.sampled_from(["rolling", "milestone", "final"]),
            st.integers(0, 60),
            st.integers(1, 10_000),
        ),
        max_size=8,
    ).map(tuple),
)


def build(app: FastAPI, shapes: list[RunShape]) -> None:
    """The runs, their active checkpoints on `hot`, and each run's totals (the split's
    balance reads them)."""
    projects = [{"id": n + 1, "name": f"p{n}", "created_at": NOW} for n in range(3)]
    runs: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    locations: list[dict[str, Any]] = []
    for n, shape in enumerate(shapes):
        run_id = f"run_{n:04d}"
        ended = shape.ended_days_ago
        runs.append(
            {
                "id": run_id,
                "project_id": shape.project + 1,
                "name": f"run-{n}",
                "status": "active" if ended is None else "completed",
                "labels": {},
                "started_at": NOW - timedelta(days=90),
                "ended_at": None if ended is None else NOW - timedelta(days=ended),
                "active_checkpoints": len(shape.checkpoints),
                "active_bytes": sum(size for _, _, size in shape.checkpoints),
            }
        )
        for step, (klass, age, size) in enumerate(shape.checkpoints):
            cid = f"ckpt_{n:04d}_{step}"
            uri = f"file:///srv/hot/p/run-{n}/step-{step}"
            made = NOW - timedelta(days=age, hours=1)
            row, location = active_checkpoint_rows(cid, run_id, step, klass, uri, size, made)
            checkpoints.append(row)
            locations.append(location)
    with session_scope(app.state.session_factory) as session:
        session.execute(insert(Project), projects)
        if runs:
            session.execute(insert(Run), runs)
        if checkpoints:
            session.execute(insert(Checkpoint), checkpoints)
            session.execute(insert(Location), locations)
        tiers = [t.name for t in app.state.tiers]
        store_policy(session, validate_policy(yaml.safe_load(POLICY), tiers), source="api", now=NOW)


def planned(app: FastAPI, processes: int, **kwargs: Any) -> CatalogPlan:
    plan_helpers.configure(processes)
    with session_scope(app.state.session_factory) as session:
        return plan_catalog(session, tiers=app.state.tiers, now=NOW, **kwargs)


def comparable(plan: CatalogPlan) -> dict[str, Any]:
    """Everything a plan says, in an order that does not depend on how it was split."""
    return {
        "items": sorted(plan.items, key=lambda i: (i.action.checkpoint_id, i.action.kind)),
        "kept": sorted(all_kept(plan)),
        "skipped": sorted(plan.skipped),
        "next_due": sorted(plan.next_due),
        "totals": plan.totals(),
    }


def all_kept(plan: CatalogPlan) -> list[Kept]:
    """The plan's kept checkpoints, those a helper handed over encoded included."""
    encoded = [orjson.loads(b"[" + piece + b"]") for piece in plan.kept_json]
    return [
        *plan.kept,
        *(Kept(k["checkpoint_id"], k["step"], tuple(k["reasons"])) for p in encoded for k in p),
    ]


@pytest.fixture
def split_everything(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every plan of a scope is split (rather than from 200,000 checkpoints)."""
    monkeypatch.setattr(plan_helpers, "SPLIT_FROM", 0)
    yield
    plan_helpers.shutdown()


def helpers_alive() -> list[BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name == "ckpt-plan-part"]


@examples(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shapes=st.lists(runs_shape, min_size=1, max_size=24), processes=st.integers(2, 3))
def test_a_split_plan_is_the_plan_of_one_process(
    app: FastAPI, split_everything: None, shapes: list[RunShape], processes: int
) -> None:
    empty(app.state.engine)
    build(app, shapes)
    # some runs' actions already in the ledger: a plan reports them open, not new
    first = next((f"run_{n:04d}" for n, s in enumerate(shapes) if s.checkpoints), None)
    if first is not None:
        run_sweep(
            app.state.session_factory,
            tiers=app.state.tiers,
            now=NOW,
            trigger="registration",
            run_id=first,
        )
    tiers = [t.name for t in app.state.tiers]
    what_if = validate_policy(yaml.safe_load(WHAT_IF), tiers)
    for kwargs in (
        {},
        {"explain": False, "due": True, "shadows": True},  # a sweep's
        {"project": "p1"},
        {"policy": what_if},
        {"kept_as_json": True},  # POST /v1/plan's: a helper's kept arrive encoded
    ):
        alone = planned(app, 1, **kwargs)
        split = planned(app, processes, **kwargs)
        assert comparable(split) == comparable(alone), kwargs
    if app.state.engine.dialect.name == "sqlite":
        assert helpers_alive() == []  # the embedded catalog is never split


@pytest.mark.parametrize(("active_runs", "state"), [(5, "pending"), (0, "held")])
def test_the_blast_radius_weighs_a_project_across_ranges(
    app: FastAPI, split_everything: None, active_runs: int, state: str
) -> None:
    """Ten runs of three milestones, the first five ended (two of three thinned each): the
    first range alone deletes more than half of what it read, the project does not (10 of
    30), and nothing is held; with every run ended (20 of 30) everything is, split or not."""
    milestones = (("milestone", 5, 100), ("milestone", 4, 100), ("milestone", 3, 100))
    shapes = [RunShape(0, None if n >= 10 - active_runs else 5, milestones) for n in range(10)]
    build(app, shapes)
    for processes in (1, 2, 3):
        deletes = [i for i in planned(app, processes).items if i.action.kind == "delete"]
        assert len(deletes) == 2 * (10 - active_runs), processes
        assert {i.state for i in deletes} == {state}, processes


def test_a_dead_helper_costs_time_not_the_plan(
    app: FastAPI, split_everything: None, caplog: pytest.LogCaptureFixture
) -> None:
    shapes = [RunShape(n % 3, None if n % 2 else 3, (("rolling", 1, 10),) * 4) for n in range(30)]
    build(app, shapes)
    if app.state.engine.dialect.name == "sqlite":  # plans are split on PostgreSQL only
        assert comparable(planned(app, 2)) == comparable(planned(app, 1))
        assert helpers_alive() == []
        return
    expected = comparable(planned(app, 1))
    assert comparable(planned(app, 2)) == expected
    (helper,) = helpers_alive()
    os.kill(helper.pid or 0, signal.SIGKILL)
    helper.join(timeout=10)
    assert comparable(planned(app, 2)) == expected  # planned here instead
    assert "plan helper gone" in caplog.text
    assert comparable(planned(app, 2)) == expected  # by a new helper
    (replacement,) = helpers_alive()
    assert replacement.pid != helper.pid
    plan_helpers.shutdown()
    assert helpers_alive() == []


@pytest.mark.parametrize("explained", [False, True])
def test_ranges_cover_every_run_once_in_about_equal_shares(
    app: FastAPI, split_everything: None, explained: bool
) -> None:
    """Equal, but for an explained plan's first range (evaluated by the process asked, which
    does not hand its part over): larger by EXPLAINED_FIRST_RANGE percent of the others."""
    counts = [(n * 37) % 11 for n in range(200)]  # some runs have no checkpoint left
    shapes = [RunShape(n % 3, None, (("rolling", 1, 10),) * c) for n, c in enumerate(counts)]
    build(app, shapes)
    first = plan_helpers.EXPLAINED_FIRST_RANGE / 100 if explained else 1.0
    assert first > 1.0 or not explained
    for parts in (2, 3, 4):
        plan_helpers.configure(parts)
        with session_scope(app.state.session_factory) as session:
            ranges = plan_helpers.plan_ranges(
                session, project=None, projects=None, explained=explained
            )
            in_p1 = plan_helpers.plan_ranges(
                session, project="p1", projects=None, explained=explained
            )
        if app.state.engine.dialect.name == "sqlite":
            assert ranges is None and in_p1 is None  # the embedded catalog is never split
            continue
        assert ranges is not None and in_p1 is not None
        assert len(ranges) == parts and ranges[0][0] is None and ranges[-1][1] is None
        assert all(high == low for (_, high), (low, _) in pairwise(ranges))  # contiguous
        ids = [f"run_{n:04d}" for n in range(len(counts))]
        shares = [
            sum(
                c
                for i, c in zip(ids, counts, strict=True)
                if (low is None or i >= low) and (high is None or i < high)
            )
            for low, high in ranges
        ]
        assert sum(shares) == sum(counts)
        unit = sum(counts) / (first + parts - 1)  # a helper's share
        expected = [first * unit, *[unit] * (parts - 1)]
        assert all(abs(s - e) <= 2 * max(counts) for s, e in zip(shares, expected, strict=True)), (
            parts,
            shares,
            expected,
        )
        assert len(in_p1) == parts  # a project's runs, cut the same way


def test_helpers_started_ahead_serve_the_first_plan(app: FastAPI, split_everything: None) -> None:
    """What a service starting on a large catalog does: its helpers ready before any plan."""
    build(app, [RunShape(n % 3, 3, (("milestone", 20, 10),) * 3) for n in range(12)])
    plan_helpers.configure(2)
    with session_scope(app.state.session_factory) as session:
        started = plan_helpers.warm(session, wait=60)
    if app.state.engine.dialect.name == "sqlite":
        assert started == 0 and helpers_alive() == []
        return
    assert started == 1
    (helper,) = helpers_alive()
    assert comparable(planned(app, 2)) == comparable(planned(app, 1))
    assert [p.pid for p in helpers_alive()] == [helper.pid]


def test_a_helper_that_cannot_plan_costs_time_not_the_plan(
    app: FastAPI,
    split_everything: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A helper whose database refuses it (here: it asks for TLS, which the test server does
    not offer) reports the failure; this process plans its range, and the helper stays."""
    build(app, [RunShape(n % 3, 4, (("milestone", 20, 10),) * 3) for n in range(12)])
    expected = comparable(planned(app, 1))
    if app.state.engine.dialect.name == "sqlite":
        return  # never split: nothing to fail
    plan_helpers.shutdown()
    monkeypatch.setenv("PGSSLMODE", "require")  # read by the helper's driver, spawned now
    assert comparable(planned(app, 2)) == expected
    (failed,) = [r for r in caplog.records if r.getMessage() == "plan helper failed"]
    assert "SSL" in failed.__dict__["error"]  # the structured field the log line carries
    assert len(helpers_alive()) == 1


def test_a_service_starting_on_a_large_catalog_starts_its_helpers(
    settings: Settings, clean_engine: Engine, split_everything: None
) -> None:
    """Its first plan then finds them ready; they stop with it."""
    two = settings.model_copy(update={"plan_processes": 2})
    app = create_app(two, engine=clean_engine, roles=NO_BACKGROUND)
    build(app, [RunShape(n % 3, 3, (("milestone", 20, 10),) * 3) for n in range(6)])
    with TestClient(app) as client:
        started = helpers_alive()
        assert client.post("/v1/plan", json={}).status_code == 200
        assert helpers_alive() == started
    if clean_engine.dialect.name == "sqlite":
        assert started == []  # the embedded catalog is never split
    else:
        assert len(started) == 1
    assert helpers_alive() == []


def test_a_split_plan_answered_over_http_is_the_plan_of_one_process(
    app: FastAPI, split_everything: None
) -> None:
    """`POST /v1/plan` of a split plan, its other ranges' kept checkpoints encoded by the
    helpers, answers what one process answers: every kept checkpoint with its reasons."""
    shapes = [
        RunShape(n % 3, None if n % 2 else 3, (("milestone", 20, 10),) * 3 + (("rolling", 1, 5),))
        for n in range(24)
    ]
    build(app, shapes)
    if app.state.engine.dialect.name == "postgresql":
        split = planned(app, 2, kept_as_json=True)
        # the helper's range arrived encoded, and this process encoded its own while it
        # waited for the helper: nothing is left to encode once the plan is made
        assert split.kept == [] and len(split.kept_json) >= 2
        assert comparable(split) == comparable(planned(app, 1))

    def answer(processes: int) -> dict[str, Any]:
        with TestClient(app) as client:  # its start configures the split: then ours
            plan_helpers.configure(processes)
            response = client.post("/v1/plan", json={})
        assert response.status_code == 200
        document: dict[str, Any] = response.json()
        for name in ("actions", "kept", "skipped"):
            document[name].sort(key=orjson.dumps)
        return document

    alone = answer(1)
    assert len(alone["kept"]) == len({k["checkpoint_id"] for k in alone["kept"]}) > 24
    assert all(k["reasons"] for k in alone["kept"])
    assert answer(2) == alone


def test_a_helper_stopped_and_continued_hands_its_part_over_whole(
    app: FastAPI,
    split_everything: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A helper stopped and continued (job control, a frozen container, a debugger) while
    it writes a part larger than its pipe holds has its writes cut short; the part must
    still arrive whole and be used, not planned again here after a failed unpickling."""
    shapes = [RunShape(n % 3, None, (("milestone", 1, 10),) * 40) for n in range(150)]
    build(app, shapes)
    expected = comparable(planned(app, 1, kept_as_json=True))
    split = planned(app, 2, kept_as_json=True)  # starts the helper
    if app.state.engine.dialect.name == "sqlite":
        assert comparable(split) == expected and helpers_alive() == []  # never split
        return
    # the helper's kept checkpoints, encoded: several times what a pipe holds (64 KiB)
    assert sum(len(piece) for piece in split.kept_json) > 4 * 65536
    (helper,) = helpers_alive()
    receive = Connection._recv  # type: ignore[attr-defined]

    def trickle(self: Connection, size: int, read: Any = os.read) -> Any:
        """A reader slower than the helper: its pipe stays full, where a stop cuts its
        writes short."""

        def slowly(fd: int, most: int) -> bytes:
            time.sleep(0.0005)
            return read(fd, min(most, 8192))  # type: ignore[no-any-return]

        return receive(self, size, slowly)

    monkeypatch.setattr(Connection, "_recv", trickle)
    done = threading.Event()
    stops = 0

    def stop_and_continue() -> None:
        nonlocal stops
        while not done.is_set():
            try:
                os.kill(helper.pid or 0, signal.SIGSTOP)
                time.sleep(0.001)
                os.kill(helper.pid or 0, signal.SIGCONT)
            except ProcessLookupError:  # the helper is gone: the checks below say so
                return
            stops += 1
            time.sleep(0.002)

    same: list[bool] = []

    def plan_repeatedly() -> None:
        for _ in range(8):
            same.append(comparable(planned(app, 2, kept_as_json=True)) == expected)

    harasser = threading.Thread(target=stop_and_continue)
    planner = threading.Thread(target=plan_repeatedly, daemon=True)
    harasser.start()
    planner.start()
    planner.join(timeout=120)
    done.set()
    harasser.join()
    hung = planner.is_alive()
    if hung:  # a part cut short leaves its reader waiting: the helper's death ends the wait
        os.kill(helper.pid or 0, signal.SIGKILL)
        planner.join(timeout=60)
    assert not hung, "a plan waited two minutes for its helper's part"
    assert same == [True] * 8
    assert stops > 10
    assert "plan helper" not in caplog.text  # every part came from the helper, none failed
    assert [p.pid for p in helpers_alive()] == [helper.pid]


def test_a_frozen_helper_costs_time_not_the_plan(
    app: FastAPI,
    split_everything: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A helper stopped for good (a frozen container, a debugger left attached) would keep
    every plan, and a sweep with the evaluation lock, waiting for its part: past its
    patience the plan kills it and evaluates the range here; the next plan has a new one."""
    build(
        app, [RunShape(n % 3, None if n % 2 else 3, (("milestone", 5, 10),) * 3) for n in range(20)]
    )
    expected = comparable(planned(app, 1))
    if app.state.engine.dialect.name == "sqlite":
        assert comparable(planned(app, 2)) == expected and helpers_alive() == []
        return
    assert comparable(planned(app, 2)) == expected  # starts the helper
    (helper,) = helpers_alive()
    patience = plan_helpers.HELPER_PATIENCE_S
    monkeypatch.setattr(plan_helpers, "HELPER_PATIENCE_S", 1.0)
    plans: list[CatalogPlan] = []
    planner = threading.Thread(target=lambda: plans.append(planned(app, 2)), daemon=True)
    os.kill(helper.pid or 0, signal.SIGSTOP)
    try:
        planner.start()
        planner.join(timeout=60)  # its patience (1 s here) and the range, not for ever
        hung = planner.is_alive()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.pid or 0, signal.SIGCONT)  # a plan still waiting ends now
        planner.join(timeout=60)
    assert not hung, "a plan waited a minute for a stopped helper"
    assert comparable(plans[0]) == expected  # planned here instead
    assert "plan helper too slow" in caplog.text
    helper.join(timeout=10)
    assert helper.exitcode == -signal.SIGKILL  # killed, not left stopped
    # the new helper starts a process and imports the service: given the usual patience,
    # as on a loaded machine 1 s is too short for that and would kill it too
    monkeypatch.setattr(plan_helpers, "HELPER_PATIENCE_S", patience)
    assert comparable(planned(app, 2)) == expected  # by a new helper
    (replacement,) = helpers_alive()
    assert replacement.pid != helper.pid
