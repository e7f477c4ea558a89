"""Work whose action failed is planned again only after a pause that doubles with each
failure: a provider down for a day leaves a few failed actions per checkpoint, not one per
sweep (and the plan says why the checkpoint waits)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.session import session_scope
from app.services.lifecycle.ledger import add_action, new_action
from app.services.lifecycle.plan_ledger import replan_after
from app.services.lifecycle.planning import plan_catalog
from tests.builders import end_run, make_run, place_checkpoint, put_policy

POLICY = """\
name: cool
rules:
  - {name: cool, class: milestone, when: {run_ended: 0s}, action: {move_to: cold}}
"""


def fail_a_move(
    app: FastAPI,
    checkpoint: dict[str, Any],
    at: datetime,
    *,
    rule: str = "cool/cool",
    end: bool = True,
) -> str:
    """A move the policy planned (or a person asked for: rule `manual`), its attempts spent
    (as if the provider was down); with `end=False` it is still pending. Returns its id."""
    with session_scope(app.state.session_factory) as session:
        action = new_action(
            checkpoint_id=checkpoint["id"],
            run_id=checkpoint["run_id"],
            kind="move",
            from_tier="hot",
            to_tier="cold",
            rule=rule,
            reason="run ended",
            state="pending",
            size=checkpoint["size_bytes"],
            actor="rule:cool/cool",
            now=at,
            due_at=at,
        )
        add_action(session, action, at)
        session.flush()
        if end:
            action.state, action.finished_at, action.error = "failed", at, "503 SlowDown"
        return action.id


def planned_moves(app: FastAPI, now: datetime) -> tuple[set[str], list[str]]:
    with session_scope(app.state.session_factory) as session:
        plan = plan_catalog(session, tiers=app.state.tiers, now=now)
        return (
            {item.action.checkpoint_id for item in plan.items},
            [s.reason for s in plan.skipped],
        )


def test_failed_work_waits_longer_after_each_failure(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, POLICY)
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 100, "milestone")
    other = place_checkpoint(client, data_dir, run, 200, "milestone")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    start = datetime.now(UTC)
    assert planned_moves(app, start)[0] == {checkpoint["id"], other["id"]}

    fail_a_move(app, checkpoint, start)
    planned, skipped = planned_moves(app, start + timedelta(minutes=1))
    assert planned == {other["id"]}  # the one that did not fail is not held back
    assert len(skipped) == 1 and skipped[0].startswith("move failed 1 time (last at ")
    assert "planned again after" in skipped[0]
    assert planned_moves(app, start + replan_after(1))[0] == {checkpoint["id"], other["id"]}

    second = start + replan_after(1)
    fail_a_move(app, checkpoint, second)
    assert replan_after(2) == 2 * replan_after(1)
    assert checkpoint["id"] not in planned_moves(app, second + replan_after(1))[0]
    assert checkpoint["id"] in planned_moves(app, second + replan_after(2))[0]
    assert replan_after(40) == timedelta(hours=24)  # however long the outage


def test_a_sweep_does_not_write_the_failed_work_again_until_then(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, POLICY)
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 100, "milestone")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    fail_a_move(app, checkpoint, datetime.now(UTC))
    response = client.post("/v1/sweeps", json={})
    assert response.status_code == 202, response.text
    assert response.json()["actions"] == []
    plan = client.post("/v1/plan", json={}).json()
    assert plan["actions"] == []
    assert [s["checkpoint_id"] for s in plan["skipped"]] == [checkpoint["id"]]


def test_one_runs_evaluation_reads_the_ledger_as_a_whole_plan_does(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """A registration evaluates its run alone and reads that run's ledger in one statement
    (open and failed actions together); it must hold back and report the same work as a
    plan of the whole catalog, which counts failures in the database."""
    put_policy(client, POLICY)
    run = make_run(client)
    twice = place_checkpoint(client, data_dir, run, 100, "milestone")
    by_hand = place_checkpoint(client, data_dir, run, 200, "milestone")
    underway = place_checkpoint(client, data_dir, run, 300, "milestone")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    start = datetime.now(UTC)
    fail_a_move(app, twice, start - replan_after(1))
    fail_a_move(app, twice, start)
    fail_a_move(app, by_hand, start, rule="manual")  # a person's failure holds nothing back
    open_id = fail_a_move(app, underway, start, end=False)

    def plans(at: datetime) -> list[tuple[list[tuple[str, str, str | None]], list[str]]]:
        with session_scope(app.state.session_factory) as session:
            found = [
                plan_catalog(session, tiers=app.state.tiers, now=at, run_id=scope)
                for scope in (run["id"], None)
            ]
        return [
            (
                sorted((i.action.checkpoint_id, i.state, i.open_action_id) for i in p.items),
                sorted(s.reason for s in p.skipped),
            )
            for p in found
        ]

    one, whole = plans(start + timedelta(minutes=1))
    assert one == whole
    items, skipped = one
    assert items == sorted([(by_hand["id"], "pending", None), (underway["id"], "pending", open_id)])
    assert len(skipped) == 1 and skipped[0].startswith("move failed 2 times (last at ")
    one, whole = plans(start + replan_after(2))
    assert one == whole
    assert {checkpoint for checkpoint, *_ in one[0]} == {twice["id"], by_hand["id"], underway["id"]}
