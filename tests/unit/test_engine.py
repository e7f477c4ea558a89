"""The policy engine (DESIGN section 7), table-driven: each case is a run, its checkpoints,
a policy's rules and the exact deletes, moves and copies the plan must hold."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.policy.engine import GRACE, protections, select_policy
from app.policy.schema import Policy
from tests.unit.engine_builders import (
    NOW,
    OLD,
    copies,
    deleted_ids,
    deleted_steps,
    kept_reasons,
    kept_steps,
    make_checkpoint,
    make_checkpoints,
    make_policy,
    make_run,
    moves,
    plan_for,
    rule,
)

STEPS = list(range(100, 1001, 100))  # 100, 200, ..., 1000
ROLLING = make_checkpoints(STEPS)
COMPLETED = make_run(status="completed")
ACTIVE = make_run(status="active")


@dataclass(frozen=True)
class Case:
    id: str
    rules: Sequence[Mapping[str, Any]]
    checkpoints: Sequence[CheckpointSnapshot]
    run: RunSnapshot = COMPLETED
    deleted: frozenset[int] = frozenset()
    moved: Mapping[int, str] = field(default_factory=dict)
    copied: frozenset[tuple[int, str]] = frozenset()
    resumed_by_active: tuple[str, ...] = ()
    now: datetime = NOW


def check(case: Case) -> None:
    policy = make_policy(rules=case.rules)
    plan = plan_for(
        policy, case.run, case.checkpoints, now=case.now, resumed_by_active=case.resumed_by_active
    )
    assert deleted_steps(plan) == set(case.deleted)
    assert moves(plan) == dict(case.moved)
    assert copies(plan) == set(case.copied)
    live = {c.step for c in case.checkpoints if c.state == "active" and c.run_id == case.run.id}
    assert kept_steps(plan) == live - set(case.deleted)


def below(step: int, steps: Sequence[int] = STEPS) -> frozenset[int]:
    return frozenset(s for s in steps if s < step)


def cases(*table: Case) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", table, ids=[c.id for c in table])


# -- keep clauses ------------------------------------------------------------------------------

LOSS = {100: 0.9, 200: 0.5, 300: 0.7, 500: 0.6, 600: 0.8}  # step 400 has no eval_loss
SCORED = [
    make_checkpoint(s, metrics={"eval_loss": LOSS[s]} if s in LOSS else {"acc": 0.1})
    for s in range(100, 700, 100)
]
AGED = [
    make_checkpoint(100, age=timedelta(days=1)),
    make_checkpoint(200, age=timedelta(hours=3)),
    make_checkpoint(300, age=timedelta(hours=1)),
    make_checkpoint(400, age=timedelta(minutes=30)),
]


def best(mode: str, count: int) -> dict[str, Any]:
    return {"metric": "eval_loss", "mode": mode, "count": count}


@cases(
    Case("no keep clause deletes all", [rule()], ROLLING, deleted=frozenset(STEPS)),
    Case("keep_last 3", [rule(keep_last=3)], ROLLING, deleted=below(800)),
    Case("keep_last 1", [rule(keep_last=1)], ROLLING, deleted=below(1000)),
    Case("keep_last 0 keeps none", [rule(keep_last=0)], ROLLING, deleted=frozenset(STEPS)),
    Case("keep_last -1 keeps all", [rule(keep_last=-1)], ROLLING),
    Case("keep_last larger than the run", [rule(keep_last=50)], ROLLING),
    Case(
        "keep_best min 2 keeps the lowest and the one without the metric",
        [rule(keep_best=best("min", 2))],
        SCORED,
        deleted=frozenset({100, 300, 600}),
    ),
    Case(
        "keep_best max 2",
        [rule(keep_best=best("max", 2))],
        SCORED,
        deleted=frozenset({200, 300, 500}),
    ),
    Case(
        "keep_best count 0 still keeps the one without the metric",
        [rule(keep_best=best("min", 0))],
        SCORED,
        deleted=frozenset({100, 200, 300, 500, 600}),
    ),
    Case("keep_best count -1 keeps all", [rule(keep_best=best("min", -1))], SCORED),
    Case(
        "keep_every 300 keeps steps divisible by 300",
        [rule(keep_every={"steps": 300})],
        ROLLING,
        deleted=frozenset(STEPS) - {300, 600, 900},
    ),
    Case("keep_every 1 keeps all", [rule(keep_every={"steps": 1})], ROLLING, deleted=frozenset()),
    Case(
        "keep_within 2h keeps what was created in the last 2h",
        [rule(keep_within="2h")],
        AGED,
        deleted=frozenset({100, 200}),
    ),
    Case("keep_within 2d keeps all", [rule(keep_within="2d")], AGED, deleted=frozenset()),
    Case(
        "union: keep_last 2 or keep_every 500",
        [rule(keep_last=2, keep_every={"steps": 500})],
        ROLLING,
        deleted=frozenset(STEPS) - {1000, 900, 500},
    ),
    Case(
        "union: keep_best 1 with keep_last 1 keeps the best and the latest (PITFALLS 2, 3)",
        [rule(keep_best=best("min", 1), keep_last=1)],
        SCORED,
        deleted=frozenset({100, 300, 500}),
    ),
    Case(
        "union: keep_within 2h or keep_last 1",
        [rule(keep_within="2h", keep_last=1)],
        [*AGED[:2], make_checkpoint(50, age=timedelta(minutes=10))],
        deleted=frozenset({100}),
    ),
)
def test_keep_clauses(case: Case) -> None:
    check(case)


# -- keep clauses rank among the run's live checkpoints of the class, `when` or not ---------

MIXED_TIERS = [
    make_checkpoint(100, tier="warm"),
    make_checkpoint(200, tier="warm"),
    make_checkpoint(300, tier="warm"),
    make_checkpoint(400, tier="hot"),
    make_checkpoint(500, tier="hot"),
]
MIXED_AGES = [
    make_checkpoint(100, age=timedelta(days=30)),
    make_checkpoint(200, age=timedelta(days=20)),
    make_checkpoint(300, age=timedelta(days=10)),
    make_checkpoint(400, age=timedelta(days=2)),
    make_checkpoint(500, age=timedelta(days=1)),
]
MIXED_CLASSES = [
    make_checkpoint(100, klass="rolling"),
    make_checkpoint(200, klass="rolling"),
    make_checkpoint(300, klass="milestone"),
    make_checkpoint(400, klass="rolling"),
    make_checkpoint(500, klass="milestone"),
    make_checkpoint(600, klass="final"),
]


@cases(
    Case(
        "keep_last ranks over all tiers, on_tier only selects what to act on",
        [rule(keep_last=2, when={"on_tier": ["warm"]})],
        MIXED_TIERS,
        deleted=frozenset({100, 200, 300}),
    ),
    Case(
        "keep_last ranks over young checkpoints too",
        [rule(keep_last=3, when={"age": "7d"})],
        MIXED_AGES,
        deleted=frozenset({100, 200}),
    ),
    Case(
        "keep_last counts only the rule's class",
        [rule(keep_last=1, klass="rolling")],
        MIXED_CLASSES,
        deleted=frozenset({100, 200}),
    ),
    Case(
        "a class list selects several classes",
        [rule(keep_last=1, klass=["rolling", "milestone"])],
        MIXED_CLASSES,
        deleted=frozenset({100, 200, 300, 400}),
    ),
    Case(
        "omitted class selects every class",
        [rule(keep_last=2)],
        MIXED_CLASSES,
        deleted=frozenset({100, 200, 300, 400}),
    ),
    Case(
        "a class with no checkpoints changes nothing",
        [rule(klass="scratch")],
        MIXED_CLASSES,
    ),
)
def test_keep_ranking_scope(case: Case) -> None:
    check(case)


# -- `when` conditions ------------------------------------------------------------------------


def ended(days: float, status: str = "completed") -> RunSnapshot:
    return make_run(status=status, ended_at=NOW - timedelta(days=days))


ACTIVE_ENDED = make_run(status="active", ended_at=NOW - timedelta(days=100))
NEVER_ENDED = RunSnapshot(id="run-1", project="proj", name="run-1", status="completed")
TIERED = [
    make_checkpoint(100, tier="hot"),
    make_checkpoint(200, tier="warm"),
    make_checkpoint(300, tier="cold"),
    make_checkpoint(400, tier="archive"),
]


@cases(
    Case(
        "age 7d: only checkpoints at least 7 days old",
        [rule(when={"age": "7d"})],
        MIXED_AGES,
        deleted=frozenset({100, 200, 300}),
    ),
    Case(
        "age 7d: exactly 7 days old is old enough",
        [rule(when={"age": "7d"})],
        [
            make_checkpoint(100, age=timedelta(days=7)),
            make_checkpoint(200, age=timedelta(days=7) - timedelta(seconds=1)),
        ],
        deleted=frozenset({100}),
    ),
    Case("age 0s: everything", [rule(when={"age": "0s"})], ROLLING, deleted=frozenset(STEPS)),
    Case(
        "run_ended 7d: ended 8 days ago",
        [rule(when={"run_ended": "7d"})],
        ROLLING,
        run=ended(8),
        deleted=frozenset(STEPS),
    ),
    Case(
        "run_ended 7d: ended exactly 7 days ago",
        [rule(when={"run_ended": "7d"})],
        ROLLING,
        run=ended(7),
        deleted=frozenset(STEPS),
    ),
    Case("run_ended 7d: ended 6 days ago", [rule(when={"run_ended": "7d"})], ROLLING, run=ended(6)),
    Case(
        "run_ended 7d: a failed run ended 8 days ago",
        [rule(when={"run_ended": "7d"})],
        ROLLING,
        run=ended(8, "failed"),
        deleted=frozenset(STEPS),
    ),
    Case(
        "run_ended 0s: ended just now",
        [rule(when={"run_ended": "0s"})],
        ROLLING,
        run=ended(0),
        deleted=frozenset(STEPS),
    ),
    Case(
        "run_ended never matches an active run, even with an ended_at",
        [rule(when={"run_ended": "0s"})],
        ROLLING,
        run=ACTIVE_ENDED,
    ),
    Case(
        "run_ended needs an ended_at",
        [rule(when={"run_ended": "0s"})],
        ROLLING,
        run=NEVER_ENDED,
    ),
    Case(
        "run_status completed matches a completed run",
        [rule(when={"run_status": ["completed"]})],
        ROLLING,
        deleted=frozenset(STEPS),
    ),
    Case(
        "run_status completed does not match a failed run",
        [rule(when={"run_status": ["completed"]})],
        ROLLING,
        run=ended(1, "failed"),
    ),
    Case(
        "run_status list: failed or completed",
        [rule(when={"run_status": ["failed", "completed"]})],
        ROLLING,
        run=ended(1, "failed"),
        deleted=frozenset(STEPS),
    ),
    Case(
        "run_status active matches an active run (its resume point stays)",
        [rule(when={"run_status": ["active"]})],
        ROLLING,
        run=ACTIVE,
        deleted=below(1000),
    ),
    Case(
        "run_status active does not match a completed run",
        [rule(when={"run_status": ["active"]})],
        ROLLING,
    ),
    Case(
        "on_tier matches the primary tier",
        [rule(when={"on_tier": ["warm", "archive"]})],
        TIERED,
        deleted=frozenset({200, 400}),
    ),
    Case(
        "on_tier ignores replicas",
        [rule(when={"on_tier": ["cold"]})],
        [make_checkpoint(100, tier="hot", replicas=["cold"]), make_checkpoint(200, tier="cold")],
        deleted=frozenset({200}),
    ),
    Case(
        "every condition must hold",
        [rule(when={"age": "7d", "on_tier": ["warm"], "run_status": ["completed"]})],
        [
            make_checkpoint(100, tier="warm", age=timedelta(days=8)),
            make_checkpoint(200, tier="hot", age=timedelta(days=8)),
            make_checkpoint(300, tier="warm", age=timedelta(days=6)),
        ],
        deleted=frozenset({100}),
    ),
)
def test_when_conditions(case: Case) -> None:
    check(case)


# -- actions ----------------------------------------------------------------------------------


@cases(
    Case("delete", [rule(keep_last=2)], TIERED, deleted=frozenset({100, 200})),
    Case(
        "move_to cold only demotes: hot and warm move, cold and archive stay",
        [rule(action={"move_to": "cold"})],
        TIERED,
        moved={100: "cold", 200: "cold"},
    ),
    Case(
        "move_to hot (the hottest) never moves anything",
        [rule(action={"move_to": "hot"})],
        TIERED,
    ),
    Case(
        "move_to archive moves every tier but archive",
        [rule(action={"move_to": "archive"})],
        TIERED,
        moved={100: "archive", 200: "archive", 300: "archive"},
    ),
    Case(
        "move_to with keep_last",
        [rule(keep_last=1, action={"move_to": "cold"})],
        make_checkpoints([100, 200, 300]),
        moved={100: "cold", 200: "cold"},
    ),
    Case(
        "move_to to a tier already holding a replica still moves the primary",
        [rule(action={"move_to": "cold"})],
        [make_checkpoint(100, tier="hot", replicas=["cold"])],
        moved={100: "cold"},
    ),
    Case(
        "copy_to archive: nothing where archive already holds a location",
        [rule(action={"copy_to": "archive"})],
        [
            make_checkpoint(100, tier="hot"),
            make_checkpoint(200, tier="hot", replicas=["archive"]),
            make_checkpoint(300, tier="archive"),
            make_checkpoint(400, tier="cold", replicas=["warm"]),
        ],
        copied=frozenset({(100, "archive"), (400, "archive")}),
    ),
    Case(
        "copy_to to a hotter tier is allowed (it removes nothing)",
        [rule(action={"copy_to": "hot"})],
        [make_checkpoint(100, tier="cold")],
        copied=frozenset({(100, "hot")}),
    ),
    Case(
        "copy_to with keep_last",
        [rule(keep_last=1, action={"copy_to": "archive"})],
        make_checkpoints([100, 200]),
        copied=frozenset({(100, "archive")}),
    ),
)
def test_actions(case: Case) -> None:
    check(case)


def test_planned_action_fields() -> None:
    checkpoints = [
        make_checkpoint(100, tier="hot", size_bytes=123),
        make_checkpoint(200, tier="warm", size_bytes=456),
        make_checkpoint(300, tier="hot", klass="final", size_bytes=789),
    ]
    policy = make_policy(
        rules=[
            rule("gone", klass="rolling", when={"on_tier": ["hot"]}),
            rule("cool", klass="rolling", action={"move_to": "cold"}),
            rule("keep-safe", klass="final", action={"copy_to": "archive"}),
        ],
        name="lifecycle",
    )
    plan = plan_for(policy, COMPLETED, checkpoints)
    by_step = {a.step: a for a in plan.actions}
    delete, move, copy = by_step[100], by_step[200], by_step[300]
    assert (delete.kind, delete.from_tier, delete.to_tier) == ("delete", "hot", None)
    assert (move.kind, move.from_tier, move.to_tier) == ("move", "warm", "cold")
    assert (copy.kind, copy.from_tier, copy.to_tier) == ("copy", "hot", "archive")
    assert [delete.rule, move.rule, copy.rule] == [
        "lifecycle/gone",
        "lifecycle/cool",
        "lifecycle/keep-safe",
    ]
    assert [delete.bytes, move.bytes, copy.bytes] == [123, 456, 789]
    assert {a.run_id for a in plan.actions} == {"run-1"}
    assert {a.checkpoint_id for a in plan.actions} == {"run-1-100", "run-1-200", "run-1-300"}
    assert [a.step for a in plan.actions] == [300, 200, 100]


# -- several rules on one checkpoint ---------------------------------------------------------

FOUR = make_checkpoints([100, 200, 300, 400])


@cases(
    Case(
        "delete beats move",
        [rule("a-move", action={"move_to": "cold"}), rule("b-delete", keep_last=2)],
        FOUR,
        deleted=frozenset({100, 200}),
        moved={300: "cold", 400: "cold"},
    ),
    Case(
        "delete beats copy",
        [rule("a-copy", action={"copy_to": "archive"}), rule("b-delete", keep_last=1)],
        FOUR,
        deleted=frozenset({100, 200, 300}),
        copied=frozenset({(400, "archive")}),
    ),
    Case(
        "move beats copy",
        [rule("a-copy", action={"copy_to": "archive"}), rule("b-move", action={"move_to": "warm"})],
        FOUR,
        moved={100: "warm", 200: "warm", 300: "warm", 400: "warm"},
    ),
    Case(
        "a copy that stands when the move would change nothing",
        [rule("a-copy", action={"copy_to": "archive"}), rule("b-move", action={"move_to": "cold"})],
        [make_checkpoint(100, tier="hot"), make_checkpoint(200, tier="cold")],
        moved={100: "cold"},
        copied=frozenset({(200, "archive")}),
    ),
    Case(
        "the coldest move wins",
        [
            rule("a", action={"move_to": "warm"}),
            rule("b", action={"move_to": "archive"}),
            rule("c", action={"move_to": "cold"}),
        ],
        FOUR,
        moved={100: "archive", 200: "archive", 300: "archive", 400: "archive"},
    ),
    Case(
        "the coldest move wins where it applies, a warmer one elsewhere",
        [rule("a", action={"move_to": "warm"}), rule("b", keep_last=2, action={"move_to": "cold"})],
        FOUR,
        moved={100: "cold", 200: "cold", 300: "warm", 400: "warm"},
    ),
    Case(
        "distinct copies all stand",
        [rule("a", action={"copy_to": "archive"}), rule("b", action={"copy_to": "cold"})],
        make_checkpoints([100]),
        copied=frozenset({(100, "archive"), (100, "cold")}),
    ),
    Case(
        "a rule's keep clause exempts only from that rule's action",
        [rule("a-keep", keep_last=-1), rule("b-delete", keep_last=1)],
        FOUR,
        deleted=frozenset({100, 200, 300}),
    ),
)
def test_conflicts(case: Case) -> None:
    check(case)


CONFLICTING_RULES: list[dict[str, Any]] = [
    rule("delete-old", keep_last=3, when={"age": "7d"}),
    rule("thin", keep_every={"steps": 200}),
    rule("cool-warm", keep_last=1, action={"move_to": "warm"}),
    rule("cool-cold", keep_last=2, action={"move_to": "cold"}),
    rule("archive", action={"copy_to": "archive"}),
    rule("backup", klass="milestone", action={"copy_to": "cold"}),
]
CONFLICT_CHECKPOINTS = [
    make_checkpoint(step, klass="milestone" if step % 300 == 0 else "rolling", age=age)
    for step, age in zip(
        range(100, 1100, 100), [timedelta(days=d) for d in range(20, 0, -2)], strict=True
    )
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(CONFLICTING_RULES))))[::37])
def test_rule_order_does_not_matter(order: tuple[int, ...]) -> None:
    reference = plan_for(make_policy(rules=CONFLICTING_RULES), COMPLETED, CONFLICT_CHECKPOINTS)
    shuffled = [CONFLICTING_RULES[i] for i in order]
    assert plan_for(make_policy(rules=shuffled), COMPLETED, CONFLICT_CHECKPOINTS) == reference


def test_two_deletes_on_one_checkpoint_are_one_action() -> None:
    policy = make_policy(rules=[rule("zeta"), rule("alpha")])
    plan = plan_for(policy, COMPLETED, make_checkpoints([100]))
    assert [(a.kind, a.rule) for a in plan.actions] == [("delete", "pol/alpha")]


# -- protections --------------------------------------------------------------------------------

RESUMED_FROM_SELF = make_run(status="active", resumed_from="run-1-200")
RESUMED_FROM_SELF_DONE = make_run(status="completed", resumed_from="run-1-200")


@cases(
    Case(
        "pinned is never deleted",
        [rule()],
        [make_checkpoint(100, pinned=True), make_checkpoint(200)],
        deleted=frozenset({200}),
    ),
    Case(
        "pinned is never moved",
        [rule(action={"move_to": "cold"})],
        [make_checkpoint(100, pinned=True), make_checkpoint(200)],
        moved={200: "cold"},
    ),
    Case(
        "pinned still gets copies",
        [rule(action={"copy_to": "archive"})],
        [make_checkpoint(100, pinned=True)],
        copied=frozenset({(100, "archive")}),
    ),
    Case(
        "pinned: the delete is dropped, the copy stands",
        [rule("a-delete"), rule("b-copy", action={"copy_to": "archive"})],
        [make_checkpoint(100, pinned=True), make_checkpoint(200)],
        deleted=frozenset({200}),
        copied=frozenset({(100, "archive")}),
    ),
    Case(
        "the resume point of an active run stays",
        [rule()],
        ROLLING,
        run=ACTIVE,
        deleted=below(1000),
    ),
    Case(
        "the resume point is never moved but still copied",
        [rule("a", action={"move_to": "cold"}), rule("b", action={"copy_to": "archive"})],
        make_checkpoints([100, 200]),
        run=ACTIVE,
        moved={100: "cold"},
        copied=frozenset({(200, "archive")}),
    ),
    Case(
        "the resume point is the highest step of any class",
        [rule(klass="rolling")],
        [*make_checkpoints([100, 200, 300]), make_checkpoint(400, klass="milestone")],
        run=ACTIVE,
        deleted=frozenset({100, 200, 300}),
    ),
    Case(
        "a finished run has no resume point",
        [rule()],
        ROLLING,
        run=ended(1),
        deleted=frozenset(STEPS),
    ),
    Case(
        "a checkpoint an active run resumed from stays",
        [rule()],
        make_checkpoints([100, 200, 300]),
        resumed_by_active=("run-1-200", "other-run-7"),
        deleted=frozenset({100, 300}),
    ),
    Case(
        "the run's own resumed_from stays while it is active",
        [rule()],
        make_checkpoints([100, 200, 300, 400]),
        run=RESUMED_FROM_SELF,
        deleted=frozenset({100, 300}),
    ),
    Case(
        "the run's own resumed_from is not protected once the run is over",
        [rule()],
        make_checkpoints([100, 200, 300]),
        run=RESUMED_FROM_SELF_DONE,
        deleted=frozenset({100, 200, 300}),
    ),
    Case(
        "grace: younger than 60 s is neither deleted nor moved",
        [rule("a", klass="rolling"), rule("b", klass="milestone", action={"move_to": "cold"})],
        [
            make_checkpoint(100, age=timedelta(seconds=59)),
            make_checkpoint(200, age=timedelta(seconds=1)),
            make_checkpoint(300, age=timedelta(0)),
            make_checkpoint(400, age=timedelta(seconds=59), klass="milestone"),
        ],
    ),
    Case(
        "grace ends at 60 s",
        [rule()],
        [make_checkpoint(100, age=GRACE), make_checkpoint(200, age=timedelta(seconds=61))],
        deleted=frozenset({100, 200}),
    ),
    Case(
        "a created_at ahead of now is less than 60 s old",
        [rule()],
        [make_checkpoint(100, created_at=NOW + timedelta(hours=1)), make_checkpoint(200)],
        deleted=frozenset({200}),
    ),
    Case(
        "a back-dated created_at gets no grace",
        [rule()],
        [make_checkpoint(100, age=timedelta(days=3))],
        deleted=frozenset({100}),
    ),
    Case(
        "grace still gets copies",
        [rule(action={"copy_to": "archive"})],
        [make_checkpoint(100, age=timedelta(seconds=5))],
        copied=frozenset({(100, "archive")}),
    ),
)
def test_protections(case: Case) -> None:
    check(case)


def test_protection_reasons() -> None:
    run = make_run(status="active")
    checkpoints = [
        make_checkpoint(100, pinned=True),
        make_checkpoint(200),
        make_checkpoint(300, age=timedelta(seconds=10)),
        make_checkpoint(400),
        make_checkpoint(500, state="writing"),
    ]
    found = protections(run, [c for c in checkpoints if c.state == "active"], NOW, ["run-1-200"])
    assert found == {
        "run-1-100": "protected: pinned",
        "run-1-200": "protected: an active run resumed from it",
        "run-1-300": "protected: created less than 60s ago",
        "run-1-400": "protected: resume point of the active run",
    }
    plan = plan_for(make_policy(rules=[rule()]), run, checkpoints, resumed_by_active=["run-1-200"])
    assert plan.actions == ()
    for checkpoint_id, reason in found.items():
        assert kept_reasons(plan, checkpoint_id)[0] == reason


# -- what rules see: only the run's own `active` checkpoints ---------------------------------


@cases(
    Case(
        "a writing checkpoint neither counts toward keep_last nor is deleted (PITFALLS 7)",
        [rule(keep_last=2)],
        [*make_checkpoints([100, 200, 300]), make_checkpoint(400, state="writing")],
        deleted=frozenset({100}),
    ),
    Case(
        "a writing checkpoint is not the resume point (PITFALLS 7)",
        [rule()],
        [*make_checkpoints([100, 200, 300]), make_checkpoint(400, state="writing")],
        run=ACTIVE,
        deleted=frozenset({100, 200}),
    ),
    Case(
        "the only complete checkpoint survives a keep_last 1 during an async save",
        [rule(keep_last=1)],
        [make_checkpoint(100), make_checkpoint(200, state="writing")],
        run=ACTIVE,
    ),
    Case(
        "trashed and deleted checkpoints are invisible",
        [rule(keep_last=1, action={"move_to": "cold"})],
        [
            make_checkpoint(100),
            make_checkpoint(200),
            make_checkpoint(300, state="trashed"),
            make_checkpoint(400, state="deleted"),
        ],
        moved={100: "cold"},
    ),
    Case(
        "no checkpoint at all",
        [rule(keep_last=1)],
        [],
    ),
    Case(
        "only writing checkpoints: nothing to do",
        [rule()],
        [make_checkpoint(100, state="writing"), make_checkpoint(200, state="writing")],
        run=ACTIVE,
    ),
    Case(
        "steps are ordered as numbers: 10000 > 9000 (PITFALLS 1)",
        [rule(keep_last=2)],
        [
            make_checkpoint(
                step, checkpoint_id=f"checkpoint-{step}", created_at=OLD - timedelta(seconds=step)
            )
            for step in (9000, 10000, 900, 100000, 8)
        ],
        deleted=frozenset({9000, 900, 8}),
    ),
    Case(
        "the resume point is the numerically highest step (PITFALLS 1)",
        [rule()],
        [make_checkpoint(step, checkpoint_id=f"checkpoint-{step}") for step in (9000, 10000, 999)],
        run=ACTIVE,
        deleted=frozenset({9000, 999}),
    ),
    Case(
        "another run's checkpoints are never touched nor counted (PITFALLS 5)",
        [rule(keep_last=1)],
        [
            *make_checkpoints([100, 200, 300]),
            *make_checkpoints([400, 500, 10], run_id="run-2"),
        ],
        deleted=frozenset({100, 200}),
    ),
    Case(
        "another run's higher step is not this run's resume point (PITFALLS 5)",
        [rule()],
        [*make_checkpoints([100, 200]), *make_checkpoints([900], run_id="run-2")],
        run=ACTIVE,
        deleted=frozenset({100}),
    ),
)
def test_visibility_and_ordering(case: Case) -> None:
    check(case)


def test_other_runs_do_not_appear_in_the_plan() -> None:
    mine = make_checkpoints([100, 200])
    theirs = make_checkpoints([300, 400], run_id="run-2")
    policy = make_policy(rules=[rule(), rule("cool", action={"move_to": "cold"})])
    plan = plan_for(policy, COMPLETED, [*theirs, *mine])
    assert {a.checkpoint_id for a in plan.actions} == {"run-1-100", "run-1-200"}
    assert {a.run_id for a in plan.actions} == {"run-1"}
    assert plan.kept == ()
    assert plan == plan_for(policy, COMPLETED, mine)


def test_writing_checkpoint_is_absent_from_the_plan() -> None:
    checkpoints = [*make_checkpoints([100, 200]), make_checkpoint(300, state="writing")]
    plan = plan_for(make_policy(rules=[rule(keep_last=1)]), ACTIVE, checkpoints)
    assert "run-1-300" not in {a.checkpoint_id for a in plan.actions}
    assert "run-1-300" not in {k.checkpoint_id for k in plan.kept}
    assert deleted_ids(plan) == {"run-1-100"}


# -- reasons -------------------------------------------------------------------------------------


def test_every_action_and_every_kept_checkpoint_carries_reasons() -> None:
    policy = make_policy(rules=CONFLICTING_RULES, name="llm")
    plan = plan_for(policy, ACTIVE, [*CONFLICT_CHECKPOINTS, make_checkpoint(5, pinned=True)])
    assert plan.actions
    for action in plan.actions:
        rule_name = action.rule.removeprefix("llm/")
        assert action.rule == f"llm/{rule_name}"
        assert rule_name in {r["name"] for r in CONFLICTING_RULES}
        assert action.reason.startswith(f"{rule_name}: ")
    assert plan.kept
    for kept in plan.kept:
        assert kept.reasons
        assert all(reason for reason in kept.reasons)


def test_reason_texts() -> None:
    policy = make_policy(
        rules=[
            rule("rolling-keep-3", klass="rolling", keep_last=3),
            rule("young", klass="milestone", when={"age": "2d"}),
            rule("cool", klass="final", keep_every={"steps": 1000}, action={"move_to": "cold"}),
        ]
    )
    checkpoints = [
        *make_checkpoints([100, 200, 300, 400]),
        make_checkpoint(500, klass="milestone", age=timedelta(days=1)),
        make_checkpoint(600, klass="final"),
        make_checkpoint(700, klass="other"),
        make_checkpoint(800, klass="final", tier="cold"),
        make_checkpoint(1000, klass="final"),
    ]
    plan = plan_for(policy, COMPLETED, checkpoints)
    delete = next(a for a in plan.actions if a.step == 100)
    assert delete.rule == "pol/rolling-keep-3"
    assert delete.reason == "rolling-keep-3: delete, not kept by keep_last 3"
    move = next(a for a in plan.actions if a.step == 600)
    assert move.reason == "cool: move to cold, not kept by keep_every 1000 steps"
    assert kept_reasons(plan, "run-1-400") == ("rolling-keep-3: keep_last 3",)
    assert kept_reasons(plan, "run-1-500") == ("young: waiting, age 2d not reached",)
    assert kept_reasons(plan, "run-1-600") == (move.reason,)
    assert kept_reasons(plan, "run-1-700") == ("no rule applies",)
    assert kept_reasons(plan, "run-1-800") == ("cool: already on cold",)
    assert kept_reasons(plan, "run-1-1000") == ("cool: keep_every 1000 steps",)


def test_keep_best_reasons_say_when_the_metric_is_missing() -> None:
    policy = make_policy(rules=[rule("best", keep_best=best("min", 1))])
    plan = plan_for(policy, COMPLETED, SCORED)
    assert kept_reasons(plan, "run-1-200") == ("best: keep_best 1 by min eval_loss",)
    assert kept_reasons(plan, "run-1-400") == (
        "best: keep_best 1 by min eval_loss (metric missing)",
    )


def test_union_reasons_name_every_clause_that_kept() -> None:
    policy = make_policy(rules=[rule("both", keep_last=1, keep_every={"steps": 100})])
    plan = plan_for(policy, COMPLETED, make_checkpoints([100, 200]))
    assert kept_reasons(plan, "run-1-200") == ("both: keep_last 1; keep_every 100 steps",)


# -- select_policy -----------------------------------------------------------------------------


def pol(name: str, priority: int = 0, projects: Sequence[str] = ("*",), **labels: str) -> Policy:
    return make_policy(
        {
            "name": name,
            "priority": priority,
            "applies_to": {"projects": list(projects), "labels": labels},
        }
    )


POLICIES = [
    pol("default", priority=-100),
    pol("llm", priority=10, projects=["llm-*"]),
    pol("llm-big", priority=20, projects=["llm-*"], size="big"),
    pol("vision", priority=10, projects=["vision", "vit?"]),
    pol("b-tie", priority=5, projects=["shared"]),
    pol("a-tie", priority=5, projects=["shared"]),
    pol("eu", priority=30, projects=["*"], region="eu", tier="gold"),
]


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (make_run(project="llm-7b"), "llm"),
        (make_run(project="llm-70b", labels={"size": "big"}), "llm-big"),
        (make_run(project="llm-70b", labels={"size": "BIG"}), "llm"),
        (make_run(project="LLM-7b"), "default"),
        (make_run(project="vision"), "vision"),
        (make_run(project="vit5"), "vision"),
        (make_run(project="vit55"), "default"),
        (make_run(project="shared"), "a-tie"),
        (make_run(project="other", labels={"region": "eu"}), "default"),
        (make_run(project="other", labels={"region": "eu", "tier": "gold", "x": "y"}), "eu"),
        (make_run(project="llm-7b", policy="vision"), "vision"),
        (make_run(project="llm-7b", policy="default"), "default"),
        (make_run(project="llm-7b", policy="missing"), None),
    ],
    ids=lambda v: v if isinstance(v, str | type(None)) else f"{v.project}{dict(v.labels)}",
)
def test_select_policy(run: RunSnapshot, expected: str | None) -> None:
    chosen = select_policy(POLICIES, run)
    assert (chosen.name if chosen else None) == expected


def test_select_policy_order_of_policies_does_not_matter() -> None:
    run = make_run(project="shared")
    for ordering in itertools.permutations(POLICIES[3:]):
        chosen = select_policy(ordering, run)
        assert chosen is not None
        assert chosen.name == "a-tie"


def test_select_policy_without_a_match_or_default_is_none() -> None:
    assert select_policy([pol("llm", projects=["llm-*"])], make_run(project="vision")) is None
    assert select_policy([], make_run()) is None


def test_select_policy_falls_back_to_default_by_name() -> None:
    only = [pol("llm", projects=["llm-*"]), pol("default", projects=["nothing-matches"])]
    chosen = select_policy(only, make_run(project="vision"))
    assert chosen is not None
    assert chosen.name == "default"


def test_select_policy_highest_priority_beats_default() -> None:
    chosen = select_policy([pol("default", 100), pol("low", -5)], make_run())
    assert chosen is not None
    assert chosen.name == "default"
    chosen = select_policy([pol("default", 0), pol("high", 1)], make_run())
    assert chosen is not None
    assert chosen.name == "high"
