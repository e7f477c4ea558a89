"""The periodic sweep evaluates only the runs whose plan may have changed, and leaves
nothing a full replan would add: over 10,000 runs, at times chosen to cross each kind of
threshold (grace, `age`, `run_ended`, `keep_within`, a failure's backoff), with actions
failing and a policy edited between sweeps, a full plan of the whole catalog after each
incremental sweep finds no action the ledger does not already hold."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import insert, select

from app.db.models import Action, Checkpoint, Location, Project, Run
from app.db.session import session_scope
from app.policy.loading import validate_policy
from app.services.catalog.due_runs import due_run_ids
from app.services.catalog.policies import store_policy
from app.services.lifecycle.ledger import close
from app.services.lifecycle.plan_ledger import replan_after
from app.services.lifecycle.planning import plan_catalog
from app.services.lifecycle.sweep import run_sweep
from tests.builders import active_checkpoint_rows, put_policy

RUNS = 10_000
BASE = datetime(2026, 6, 1, 12, tzinfo=UTC)

POLICY = """\
name: default
rules:
  - {name: rolling, class: rolling, keep_last: 0, when: {age: 4d}, action: delete}
  - {name: thin, class: milestone, when: {run_ended: 2d}, keep_within: 5d, action: delete}
  - {name: cool, class: milestone, when: {age: 3d}, action: {move_to: cold}}
  - {name: archive, class: final, when: {run_ended: 0s}, action: {copy_to: archive}}
"""
EDITED = POLICY.replace("age: 3d", "age: 2d").replace("keep_within: 5d", "keep_within: 1d")


def build_catalog(app: FastAPI) -> None:
    """10,000 runs of a rolling checkpoint, a milestone and a final, some ended and some not,
    created over the week before BASE; some created seconds before it (in their grace)."""
    rng = random.Random(20261203)
    runs: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    locations: list[dict[str, Any]] = []
    for n in range(RUNS):
        run_id = f"run_{n:06d}"
        ended = n % 3 != 0
        runs.append(
            {
                "id": run_id,
                "project_id": 1,
                "name": f"run-{n}",
                "status": "completed" if ended else "active",
                "labels": {},
                "started_at": BASE - timedelta(days=8),
                "ended_at": BASE - timedelta(hours=rng.randint(0, 96)) if ended else None,
            }
        )
        fresh = n % 50 == 0
        for step, klass in ((1, "rolling"), (2, "milestone"), (3, "final")):
            age = (
                timedelta(seconds=rng.randint(1, 50))
                if fresh
                else timedelta(hours=rng.randint(1, 170))
            )
            cid = f"ckpt_{n:06d}_{step}"
            uri = f"file:///srv/hot/p/run-{n}/step-{step}"
            row, location = active_checkpoint_rows(cid, run_id, step, klass, uri, 1000, BASE - age)
            checkpoints.append(row)
            locations.append(location)
    with session_scope(app.state.session_factory) as session:
        session.execute(insert(Project), [{"id": 1, "name": "p", "created_at": BASE}])
        session.execute(insert(Run), runs)
        session.execute(insert(Checkpoint), checkpoints)
        session.execute(insert(Location), locations)


def sweep(app: FastAPI, now: datetime) -> int:
    """One periodic sweep; returns how many runs it evaluated."""
    with session_scope(app.state.session_factory) as session:
        due = len(due_run_ids(session, now))
    run_sweep(
        app.state.session_factory, tiers=app.state.tiers, now=now, trigger="schedule", due_only=True
    )
    return due


def missing_from_ledger(app: FastAPI, now: datetime) -> list[tuple[str, str, str | None]]:
    """What a full replan at `now` would add to the ledger."""
    with session_scope(app.state.session_factory) as session:
        plan = plan_catalog(session, tiers=app.state.tiers, now=now, explain=False)
        return [
            (i.action.checkpoint_id, i.action.kind, i.action.to_tier)
            for i in plan.items
            if i.open_action_id is None
        ]


def fail_some_moves(app: FastAPI, now: datetime, count: int) -> int:
    """`count` planned moves end failed, as a worker would end them (their runs marked)."""
    with session_scope(app.state.session_factory) as session:
        actions = session.scalars(
            select(Action).where(Action.kind == "move", Action.state == "pending").limit(count)
        ).all()
        for action in actions:
            close(session, action, "failed", now, "503 SlowDown")
        return len(actions)


def edit_policy(app: FastAPI, text: str, now: datetime) -> None:
    """What PUT /v1/policies does, at the test's clock rather than the wall clock."""
    with session_scope(app.state.session_factory) as session:
        tiers = [t.name for t in app.state.tiers]
        policy = validate_policy(yaml.safe_load(text), tiers)
        store_policy(session, policy, source="api", now=now)


def test_incremental_sweeps_leave_nothing_a_full_replan_would_add(
    client: TestClient, app: FastAPI
) -> None:
    put_policy(client, POLICY)
    build_catalog(app)
    evaluated: list[int] = []
    moments = [
        BASE,  # every run: none evaluated yet
        BASE + timedelta(minutes=1),  # the fresh ones leave their grace
        BASE + timedelta(hours=7),
        BASE + timedelta(days=2, hours=3),
        BASE + timedelta(days=3),
        BASE + timedelta(days=5),
        BASE + timedelta(days=8),
    ]
    replanned: list[int] = []
    for n, now in enumerate(moments):
        evaluated.append(sweep(app, now))
        assert missing_from_ledger(app, now) == [], f"sweep {n} at {now}"
        if n == 2:  # moves fail; their runs wait for the backoff, then plan them again
            assert fail_some_moves(app, now, 100) == 100
            for later in (now + timedelta(minutes=1), now + replan_after(1)):
                replanned.append(sweep(app, later))
                assert missing_from_ledger(app, later) == [], f"after the failures, {later}"
        if n == 4:
            edit_policy(app, EDITED, now)  # every run due again

    assert 0 < replanned[0] <= 100 and 0 < replanned[1] <= 100, replanned
    assert evaluated[0] == RUNS and evaluated[5] == RUNS  # the first, and after the edit
    assert all(e < RUNS for e in evaluated[1:5]), evaluated  # the others: what changed
    assert evaluated[1] == RUNS // 50  # a minute later: only the runs with fresh checkpoints
