"""Properties of the policy engine over random runs, checkpoints and valid policies."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.plan import CheckpointSnapshot, Plan, RunSnapshot
from app.policy.engine import evaluate
from app.policy.keep import keep_best
from tests.unit.engine_builders import (
    NOW,
    TIER_RANKS,
    TIERS,
    deleted_ids,
    make_checkpoint,
    make_policy,
    make_run,
    plan_for,
)
from tests.unit.engine_oracle import evaluate_plainly, keep_best_plainly

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CLASSES = ("rolling", "milestone", "final")
STATES = ("active", "active", "active", "writing", "trashed", "deleted")
STATUSES = ("active", "completed", "failed")
RULE_NAMES = ("alpha", "bravo", "charlie", "delta", "echo")
KEEP_CLAUSES = (
    "keep_last",
    "keep_best",
    "keep_every",
    "keep_within",
    "keep_hourly",
    "keep_daily",
    "keep_weekly",
    "keep_monthly",
    "keep_yearly",
)

# -- runs and checkpoints ------------------------------------------------------------------------


ENDED = st.none() | st.integers(0, 200 * 86400).map(lambda s: NOW - timedelta(seconds=s))


@st.composite
def runs(draw: st.DrawFn) -> RunSnapshot:
    return make_run(status=draw(st.sampled_from(STATUSES)), ended_at=draw(ENDED))


RUN_IDS = st.sampled_from(("run-1", "run-1", "run-1", "run-2"))
TIER_NAMES = st.sampled_from(TIERS)
REPLICAS = st.lists(TIER_NAMES, unique=True, max_size=2)
METRICS = st.fixed_dictionaries(
    {},
    optional={
        "loss": st.floats(0, 10, allow_nan=False, allow_infinity=False),
        "acc": st.floats(0, 1, allow_nan=False, allow_infinity=False),
    },
)
# a few seconds in the future up to ~400 days old, often inside the 60 s grace
AGES = (st.integers(-30, 120) | st.integers(-30, 400 * 86400)).map(lambda s: timedelta(seconds=s))
KLASSES = st.sampled_from(CLASSES)
STATE_NAMES = st.sampled_from(STATES)
SIZES = st.integers(0, 10**12)


@st.composite
def checkpoints_of(draw: st.DrawFn, step: int) -> CheckpointSnapshot:
    return make_checkpoint(
        step,
        run_id=draw(RUN_IDS),
        klass=draw(KLASSES),
        state=draw(STATE_NAMES),
        size_bytes=draw(SIZES),
        created_at=NOW - draw(AGES),
        tier=draw(TIER_NAMES),
        replicas=draw(REPLICAS),
        metrics=draw(METRICS),
        pinned=draw(st.booleans()),
    )


STEPS = st.lists(st.integers(0, 20) | st.integers(0, 200_000), unique=True, max_size=40)


@st.composite
def checkpoint_lists(draw: st.DrawFn) -> list[CheckpointSnapshot]:
    steps = draw(STEPS)
    return [draw(checkpoints_of(step)) for step in steps]


# -- policies ------------------------------------------------------------------------------------

counts = st.integers(-1, 6)
durations = st.builds(
    lambda n, unit: f"{n}{unit}", st.integers(0, 400), st.sampled_from(("s", "m", "h", "d", "w"))
)
CLAUSE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "keep_last": counts,
    "keep_best": st.fixed_dictionaries(
        {
            "metric": st.sampled_from(("loss", "acc")),
            "mode": st.sampled_from(("min", "max")),
            "count": counts,
        }
    ),
    "keep_every": st.fixed_dictionaries({"steps": st.integers(1, 50_000)}),
    "keep_within": durations,
    "keep_hourly": counts,
    "keep_daily": counts,
    "keep_weekly": counts,
    "keep_monthly": counts,
    "keep_yearly": counts,
}
classes = (
    st.none()
    | st.sampled_from(CLASSES)
    | st.lists(st.sampled_from(CLASSES), min_size=1, max_size=3, unique=True)
)
whens = st.fixed_dictionaries(
    {},
    optional={
        "age": durations,
        "run_ended": durations,
        "run_status": st.lists(st.sampled_from(STATUSES), min_size=1, unique=True),
        "on_tier": st.lists(st.sampled_from(TIERS), min_size=1, unique=True),
    },
)
actions = st.one_of(
    st.just("delete"),
    st.sampled_from(TIERS).map(lambda t: {"move_to": t}),
    st.sampled_from(TIERS).map(lambda t: {"copy_to": t}),
)


CLAUSE_CHOICES = st.lists(st.sampled_from(KEEP_CLAUSES), unique=True, max_size=4)


@st.composite
def rule_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A rule without its name."""
    body: dict[str, Any] = {}
    klass = draw(classes)
    if klass is not None:
        body["class"] = klass
    when = draw(whens)
    if when:
        body["when"] = when
    for clause in draw(CLAUSE_CHOICES):
        body[clause] = draw(CLAUSE_VALUES[clause])
    body["action"] = draw(actions)
    return body


RULE_BODIES = st.lists(rule_bodies(), min_size=1, max_size=len(RULE_NAMES))
NAME_ORDERS = st.permutations(RULE_NAMES)


@st.composite
def policy_dicts(draw: st.DrawFn) -> dict[str, Any]:
    bodies = draw(RULE_BODIES)
    names = draw(NAME_ORDERS)
    return {
        "name": "prop",
        "rules": [{"name": n, **b} for n, b in zip(names, bodies, strict=False)],
    }


def live_of(run: RunSnapshot, checkpoints: list[CheckpointSnapshot]) -> list[CheckpointSnapshot]:
    return [c for c in checkpoints if c.state == "active" and c.run_id == run.id]


def evaluate_dict(
    data: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    resumed: list[str] | None = None,
) -> Plan:
    return plan_for(make_policy(data), run, checkpoints, resumed_by_active=resumed or [])


def removing(plan: Plan) -> dict[str, str]:
    """checkpoint id -> kind, for the actions that take a checkpoint off its tier."""
    return {a.checkpoint_id: a.kind for a in plan.actions if a.kind in ("delete", "move")}


# -- properties ----------------------------------------------------------------------------------


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists())
def test_pinned_is_never_deleted_or_moved(
    data: dict[str, Any], run: RunSnapshot, checkpoints: list[CheckpointSnapshot]
) -> None:
    plan = evaluate_dict(data, run, checkpoints)
    pinned = {c.id for c in checkpoints if c.pinned}
    assert not pinned & set(removing(plan))


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.data())
def test_protected_checkpoints_are_never_deleted_or_moved(
    data: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    choice: st.DataObject,
) -> None:
    ids = sorted(c.id for c in checkpoints)
    resumed = choice.draw(st.lists(st.sampled_from(ids), unique=True) if ids else st.just([]))
    plan = evaluate_dict(data, run, checkpoints, resumed)
    live = live_of(run, checkpoints)
    protected = set(resumed) | {c.id for c in live if NOW - c.created_at < timedelta(seconds=60)}
    if run.status == "active" and live:
        protected.add(max(live, key=lambda c: c.step).id)
    assert not protected & set(removing(plan))


@PROPERTY
@given(policy_dicts(), checkpoint_lists())
def test_resume_point_of_an_active_run_is_never_deleted_or_moved(
    data: dict[str, Any], checkpoints: list[CheckpointSnapshot]
) -> None:
    run = make_run(status="active")
    live = live_of(run, checkpoints)
    plan = evaluate_dict(data, run, checkpoints)
    if live:
        resume_point = max(live, key=lambda c: c.step)
        assert resume_point.id not in removing(plan)
    assert {k.checkpoint_id for k in plan.kept} == {c.id for c in live} - deleted_ids(plan)


@PROPERTY
@given(runs(), checkpoint_lists(), counts, classes, whens)
def test_keep_last_never_deletes_the_highest_steps(
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    count: int,
    klass: Any,
    when: dict[str, Any],
) -> None:
    rule: dict[str, Any] = {"name": "last", "keep_last": count, "when": when, "action": "delete"}
    if klass is not None:
        rule["class"] = klass
    plan = evaluate_dict({"name": "prop", "rules": [rule]}, run, checkpoints)
    wanted = {klass} if isinstance(klass, str) else set(klass or CLASSES)
    members = sorted(
        (c for c in live_of(run, checkpoints) if c.klass in wanted),
        key=lambda c: c.step,
        reverse=True,
    )
    highest = members if count == -1 else members[:count]
    assert not {c.id for c in highest} & deleted_ids(plan)


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.data())
def test_adding_a_keep_clause_never_adds_a_delete(
    data: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    choice: st.DataObject,
) -> None:
    index = choice.draw(st.integers(0, len(data["rules"]) - 1))
    missing = [c for c in KEEP_CLAUSES if c not in data["rules"][index]]
    clause = choice.draw(st.sampled_from(missing))
    value = choice.draw(CLAUSE_VALUES[clause])
    wider = {**data, "rules": list(data["rules"])}
    wider["rules"][index] = {**data["rules"][index], clause: value}
    before = evaluate_dict(data, run, checkpoints)
    after = evaluate_dict(wider, run, checkpoints)
    assert deleted_ids(after) <= deleted_ids(before)


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.data())
def test_rule_order_never_changes_the_plan(
    data: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    choice: st.DataObject,
) -> None:
    shuffled = {**data, "rules": choice.draw(st.permutations(data["rules"]))}
    assert evaluate_dict(shuffled, run, checkpoints) == evaluate_dict(data, run, checkpoints)


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists())
def test_actions_are_well_formed(
    data: dict[str, Any], run: RunSnapshot, checkpoints: list[CheckpointSnapshot]
) -> None:
    plan = evaluate_dict(data, run, checkpoints)
    by_id = {c.id: c for c in checkpoints}
    rule_names = {r["name"] for r in data["rules"]}
    for action in plan.actions:
        target = by_id[action.checkpoint_id]
        assert target.state == "active"  # never writing, trashed or deleted
        assert target.run_id == run.id == action.run_id
        assert action.step == target.step
        assert action.bytes == target.size_bytes
        assert action.from_tier == target.tier
        assert action.rule.removeprefix("prop/") in rule_names
        assert action.rule.startswith("prop/")
        assert action.reason
        if action.kind == "copy":
            assert action.to_tier not in target.tiers
    per_checkpoint = Counter(
        removing_action.checkpoint_id
        for removing_action in plan.actions
        if removing_action.kind in ("delete", "move")
    )
    assert all(n == 1 for n in per_checkpoint.values())
    deleted = deleted_ids(plan)
    assert not any(a.kind == "copy" and a.checkpoint_id in deleted for a in plan.actions)
    for kept in plan.kept:
        assert kept.reasons


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists())
def test_moves_only_go_to_colder_tiers(
    data: dict[str, Any], run: RunSnapshot, checkpoints: list[CheckpointSnapshot]
) -> None:
    for action in evaluate_dict(data, run, checkpoints).actions:
        if action.kind == "move":
            assert action.from_tier is not None
            assert action.to_tier is not None
            assert TIER_RANKS[action.to_tier] > TIER_RANKS[action.from_tier]


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.booleans())
def test_a_caller_that_passes_only_live_checkpoints_gets_the_same_plan(
    data: dict[str, Any], run: RunSnapshot, checkpoints: list[CheckpointSnapshot], explain: bool
) -> None:
    """A sweep hands the engine each run's active checkpoints already filtered
    (`live_only`); the plan must be the one the engine makes from the unfiltered list."""
    policy = make_policy(data)
    live = [c for c in checkpoints if c.state == "active" and c.run_id == run.id]
    ranks = TIER_RANKS
    filtered = evaluate(policy, run, live, NOW, tier_ranks=ranks, explain=explain, live_only=True)
    assert filtered == evaluate(policy, run, checkpoints, NOW, tier_ranks=ranks, explain=explain)


@PROPERTY
@given(policy_dicts(), runs(), checkpoint_lists(), st.booleans(), st.data())
def test_the_engine_says_what_the_plain_reading_of_the_contract_says(
    data: dict[str, Any],
    run: RunSnapshot,
    checkpoints: list[CheckpointSnapshot],
    explain: bool,
    draws: st.DataObject,
) -> None:
    """The engine's fast paths (reasons said once per rule, protections worked out when
    first needed, a rule waiting for its run said to all its members at once) change
    nothing: the same actions, the same kept checkpoints with the same reasons in the same
    order, as the oracle that walks every rule over every checkpoint."""
    policy = make_policy(data)
    ids = sorted({c.id for c in checkpoints})
    resumed = draws.draw(st.lists(st.sampled_from(ids), max_size=2)) if ids else []
    undeleted = draws.draw(st.lists(st.sampled_from(ids), max_size=3)) if ids else []
    until = draws.draw(st.sampled_from((NOW - timedelta(hours=1), NOW + timedelta(hours=1))))
    checkpoints = [
        c._replace(protected_until=until) if c.id in undeleted else c for c in checkpoints
    ]
    options: dict[str, Any] = {"tier_ranks": TIER_RANKS, "resumed_by_active": resumed}
    expected = evaluate_plainly(policy, run, checkpoints, NOW, explain=explain, **options)
    assert evaluate(policy, run, checkpoints, NOW, explain=explain, **options) == expected


@PROPERTY
@given(
    checkpoint_lists(),
    st.sampled_from(("loss", "acc")),
    st.sampled_from(("min", "max")),
    counts,
)
def test_keep_best_keeps_what_the_plain_ranking_keeps(
    checkpoints: list[CheckpointSnapshot], metric: str, mode: str, count: int
) -> None:
    """keep_best ranks decorated tuples for speed: the same checkpoints kept, with the same
    words, as ranking them with a key per checkpoint."""
    assert keep_best(checkpoints, metric, mode, count) == keep_best_plainly(
        checkpoints, metric, mode, count
    )
