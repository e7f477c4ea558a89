"""Shadow policies in the pure code: which policy governs a run and which shadow policies
would (app.policy.engine), what a shadow policy sees (app.policy.shadow), and its
evaluation (app.services.lifecycle.shadow.evaluate_shadow, pure): idempotent, each
would-be action once, nothing for what it deleted."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cost.prices import PriceQuote
from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.domain.tier import Tier
from app.policy.engine import select_policy, shadows_of, would_govern
from app.policy.schema import Policy
from app.policy.shadow import overlays, seen
from app.services.lifecycle.shadow import evaluate_shadow
from app.services.lifecycle.snapshot import Scope
from tests.unit.engine_builders import NOW, TIER_RANKS, TIERS, make_checkpoint, make_run
from tests.unit.test_engine_properties import checkpoint_lists, policy_dicts, runs

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIER_LIST = [Tier(name=n, url=f"file:///srv/{n}", rank=r) for n, r in TIER_RANKS.items()]
PRICES = {n: PriceQuote() for n in TIERS}


def policy(name: str, *, mode: str = "enforce", **fields: Any) -> Policy:
    return Policy.model_validate({"name": name, "mode": mode, **fields})


# -- selection -----------------------------------------------------------------------------


def test_a_shadow_policy_governs_no_run() -> None:
    shadow = policy("trial", mode="shadow", priority=100)
    fallback = policy("default")
    run = make_run()
    assert select_policy([shadow, fallback], run) is fallback
    assert shadows_of([shadow, fallback], run) == [shadow]
    assert select_policy([policy("default", mode="shadow")], run) is None


def test_a_run_naming_a_shadow_policy_is_governed_by_none() -> None:
    shadow = policy("trial", mode="shadow")
    others = [shadow, policy("default"), policy("wide", priority=5)]
    run = make_run(policy="trial")
    assert select_policy(others, run) is None  # never widened to another
    assert shadows_of(others, run) == [shadow]
    assert shadows_of(others, make_run(policy="wide")) == []


def test_a_shadow_policy_is_weighed_against_the_enforced_ones_alone() -> None:
    low = policy("low", mode="shadow", priority=1)
    high = policy("high", mode="shadow", priority=9)
    enforced = policy("mid", priority=5)
    run = make_run()
    assert shadows_of([low, high, enforced], run) == [high]  # low loses to mid, not to high
    assert would_govern(low, [low, high], run)  # nothing enforced: each would win alone
    other = make_run(project="vision")
    scoped = policy("llm", mode="shadow", applies_to={"projects": ["llm-*"]})
    assert shadows_of([scoped], other) == []


SELECT_NAMES = ("default", "alpha", "bravo", "charlie")


@st.composite
def policy_sets(draw: st.DrawFn) -> list[Policy]:
    names = draw(st.lists(st.sampled_from(SELECT_NAMES), unique=True, max_size=4))
    return [
        policy(
            name,
            mode=draw(st.sampled_from(("enforce", "shadow"))),
            priority=draw(st.integers(-2, 2)),
            applies_to={
                "projects": draw(st.sampled_from((["*"], ["proj"], ["other"], ["pr*"]))),
                "labels": draw(st.sampled_from(({}, {"team": "a"}))),
            },
        )
        for name in names
    ]


@st.composite
def selection_runs(draw: st.DrawFn) -> RunSnapshot:
    return make_run(
        project=draw(st.sampled_from(("proj", "other", "x"))),
        labels=draw(st.sampled_from(({}, {"team": "a"}, {"team": "b"}))),
        policy=draw(st.none() | st.sampled_from((*SELECT_NAMES, "missing"))),
    )


@settings(max_examples=300, deadline=None)
@given(policy_sets(), selection_runs())
def test_selection_never_chooses_a_shadow_policy(policies: list[Policy], run: RunSnapshot) -> None:
    chosen = select_policy(policies, run)
    assert chosen is None or chosen.enforced
    enforced = [p for p in policies if p.enforced]
    assert chosen is select_policy(enforced, run)  # the shadow ones change nothing
    # S shadows R iff select_policy(enforced + [S taken as enforced], R) is S
    expected = [
        s.name
        for s in policies
        if not s.enforced
        and getattr(
            select_policy([*enforced, s.model_copy(update={"mode": "enforce"})], run), "name", None
        )
        == s.name
    ]
    assert [s.name for s in shadows_of(policies, run)] == expected


# -- what a shadow policy sees ---------------------------------------------------------------


def test_the_view_applies_would_be_deletes_moves_and_copies() -> None:
    kept, gone, moved, copied = (make_checkpoint(s, replicas=["archive"]) for s in (1, 2, 3, 4))
    done = [
        (gone.id, "delete", None),
        (moved.id, "move", "warm"),
        (moved.id, "move", "cold"),  # the coldest of its moves stands
        (copied.id, "copy", "warm"),
    ]
    view = {c.id: c for c in seen([kept, gone, moved, copied], overlays(done, TIER_RANKS))}
    assert set(view) == {kept.id, moved.id, copied.id}
    assert view[kept.id] == kept
    assert (view[moved.id].tier, view[moved.id].tiers) == ("cold", frozenset({"cold", "archive"}))
    assert (view[copied.id].tier, view[copied.id].tiers) == (
        "hot",
        frozenset({"hot", "warm", "archive"}),
    )


# -- its evaluation ------------------------------------------------------------------------------


def shadow_of(data: dict[str, Any]) -> Policy:
    return Policy.model_validate({**data, "mode": "shadow"}, context={"tiers": list(TIERS)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_dicts(), runs(), checkpoint_lists())
def test_the_shadow_evaluation_is_idempotent(
    data: dict[str, Any], run: RunSnapshot, checkpoints: list[CheckpointSnapshot]
) -> None:
    candidate = shadow_of(data)
    live = [c for c in checkpoints if c.state == "active" and c.run_id == run.id]
    scope = Scope(runs=[run], checkpoints={run.id: live}, resumed_by_active=set())

    def again(recorded: dict[tuple[str, str, str | None], Any]) -> list[Any]:
        return evaluate_shadow(
            candidate, run, scope, recorded, NOW, tiers=TIER_LIST, prices=PRICES, locks={}
        )

    first = again({})
    keys = [(a.checkpoint_id, a.kind, a.to_tier) for a in first]
    assert len(keys) == len(set(keys))  # each (checkpoint, kind, target) once
    deleted: set[str] = set()
    for a in first:  # nothing for a checkpoint after its would-be delete
        assert a.checkpoint_id not in deleted
        if a.kind == "delete":
            deleted.add(a.checkpoint_id)
    assert again(dict.fromkeys(keys, NOW)) == []  # a second sweep records nothing more
    pinned = {c.id for c in live if c.pinned}
    assert not any(a.checkpoint_id in pinned and a.kind != "copy" for a in first)
