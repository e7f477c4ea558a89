"""`next_change`: between now and the instant it names, a run's plan is the plan of now,
whatever the policy, the run and its checkpoints, so a sweep may leave the run alone until
then; and each kind of threshold is found where it lies."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.domain.plan import CheckpointSnapshot, Plan, RunSnapshot
from app.policy.due import next_change
from app.policy.schema import Policy
from tests.unit.engine_builders import NOW, make_checkpoint, make_run, plan_for, rule
from tests.unit.test_engine_properties import (
    PROPERTY,
    checkpoint_lists,
    live_of,
    policy_dicts,
    runs,
)


def answer(plan: Plan) -> tuple[Any, ...]:
    """What a sweep writes: the actions, and the reasons each checkpoint stays."""
    return (
        sorted((a.checkpoint_id, a.kind, a.to_tier, a.rule) for a in plan.actions),
        sorted((k.checkpoint_id, k.reasons) for k in plan.kept),
    )


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.floats(0, 1))
def test_the_plan_holds_until_the_next_change(
    raw: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    fraction: float,
) -> None:
    policy = Policy.model_validate(raw)
    live = live_of(run, checkpoints)
    now_plan = answer(plan_for(policy, run, live))
    until = next_change(policy, run, live, NOW)
    horizon = until - NOW if until is not None else timedelta(days=3000)
    last = NOW + horizon - timedelta(microseconds=1)  # the change itself comes at `until`
    for moment in (min(NOW + horizon * fraction, last), last):
        if moment >= NOW:
            assert answer(plan_for(policy, run, live, now=moment)) == now_plan, (moment, until)


def test_each_kind_of_threshold_is_found() -> None:
    ended = make_run(status="completed", ended_at=NOW - timedelta(days=1))
    old = make_checkpoint(1, created_at=NOW - timedelta(days=10), klass="milestone")
    fresh = make_checkpoint(2, created_at=NOW - timedelta(seconds=10), klass="milestone")
    undeleted = make_checkpoint(3, created_at=NOW - timedelta(days=10))
    undeleted = undeleted._replace(protected_until=NOW + timedelta(hours=5))

    def policy(**fields: Any) -> Policy:
        return Policy.model_validate({"name": "p", "rules": [rule("r", **fields)]})

    assert next_change(policy(when={"run_ended": "3d"}), ended, [old], NOW) == NOW + timedelta(
        days=2
    )
    assert next_change(policy(when={"age": "12d"}), ended, [old], NOW) == NOW + timedelta(days=2)
    assert next_change(policy(keep_within="11d"), ended, [old], NOW) == NOW + timedelta(days=1)
    assert next_change(policy(keep_last=1), ended, [old, fresh], NOW) == NOW + timedelta(
        seconds=50
    )  # the grace of the fresh one
    assert next_change(policy(keep_last=1), ended, [undeleted], NOW) == NOW + timedelta(hours=5)
    assert next_change(policy(keep_daily=3), ended, [old], NOW) is None
    assert next_change(None, ended, [fresh], NOW) is None
    lock_ends = NOW + timedelta(hours=1)
    assert next_change(policy(keep_last=1), ended, [old], NOW, also=[lock_ends]) == lock_ends
