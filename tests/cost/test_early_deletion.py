"""Early-deletion awareness (section 7b): every move and delete priced, and a demotion
skipped when the policy would take the checkpoint off its new tier, on time alone, before
the tier's minimum duration and the unserved days cost more than the move saves.

Figures are worked by hand from the catalog's list prices, for a 1 TB checkpoint:
S3 Standard $0.023, Glacier Instant Retrieval $0.004 (90 days) per GB-month."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.cost.action_pricing import ActionPricer
from app.cost.early_deletion import (
    ActionCost,
    action_cost,
    early_deletion_usd,
    skip_costly_demotions,
    weigh_demotion,
)
from app.cost.prices import PriceQuote, effective_price
from app.domain.plan import CheckpointSnapshot, Plan, PlannedAction
from app.policy.engine import evaluate
from tests.cost.helpers import TB, tier
from tests.unit.engine_builders import (
    NOW,
    TIER_RANKS,
    make_checkpoint,
    make_policy,
    make_run,
    rule,
)

STANDARD = effective_price(tier(storage_class="STANDARD"))
IA = effective_price(tier(storage_class="STANDARD_IA"))
GLACIER_IR = effective_price(tier(storage_class="GLACIER_IR"))
DEEP_ARCHIVE = effective_price(tier(storage_class="DEEP_ARCHIVE"))
PRICES = {"hot": STANDARD, "warm": IA, "cold": GLACIER_IR, "archive": DEEP_ARCHIVE}
FREE = {name: PriceQuote() for name in TIER_RANKS}


# --- pricing one action -------------------------------------------------------------------


def planned_action_cost(
    action: PlannedAction, c: CheckpointSnapshot, prices: dict[str, PriceQuote], now: datetime
) -> ActionCost:
    """An explained plan's price of one action."""
    return ActionPricer(prices, now).price(action, c)[0]


def planned_storage_change(
    action: PlannedAction, c: CheckpointSnapshot, prices: dict[str, PriceQuote]
) -> dict[str, float]:
    """An explained plan's change of each tier's bill by one action."""
    return dict(ActionPricer(prices, NOW).price(action, c)[1])


def test_a_move_pays_retrieval_early_deletion_and_requests() -> None:
    """1 TB from Glacier IR to Deep Archive after 30 of its 90 days."""
    cost = action_cost("move", TB, source=GLACIER_IR, target=DEEP_ARCHIVE, days_on_source=30)
    assert cost.retrieval_usd == pytest.approx(1000 * 0.03)  # $30
    assert cost.early_deletion_usd == pytest.approx(1000 * 0.004 * 60 / 30)  # $8
    assert cost.egress_usd == 0.0  # one provider
    assert cost.requests_usd == pytest.approx((0.01 + 0.05) / 1000)
    assert cost.total_usd == pytest.approx(38.00006)


def test_egress_is_paid_on_a_move_to_another_provider() -> None:
    b2 = effective_price(tier(endpoint_url="https://s3.us-west-004.backblazeb2.com"))
    cost = action_cost("copy", TB, source=STANDARD, target=b2)
    assert cost.egress_usd == pytest.approx(1000 * 0.09)  # $90 out of S3
    assert cost.retrieval_usd == 0.0 and cost.early_deletion_usd == 0.0
    back = action_cost("copy", TB, source=b2, target=STANDARD)
    assert back.egress_usd == 0.0  # B2's egress is free (within 3x what is stored)


def test_a_restore_from_an_archive_to_a_local_tier_pays_retrieval_and_egress() -> None:
    archive = effective_price(tier(url="gs://b/p", storage_class="ARCHIVE"))
    local = effective_price(tier(url="file:///srv/hot"))
    cost = action_cost("restore", TB, source=archive, target=local)
    assert cost.retrieval_usd == pytest.approx(50.0)  # $0.05/GB
    assert cost.egress_usd == pytest.approx(120.0)  # $0.12/GB out of Google
    assert cost.early_deletion_usd == 0.0  # a restore copies; nothing leaves the archive


def test_a_delete_pays_only_the_unserved_days() -> None:
    wasabi = effective_price(tier(endpoint_url="https://s3.wasabisys.com"))
    cost = action_cost("delete", TB, source=wasabi, days_on_source=10)
    assert cost.early_deletion_usd == pytest.approx(1000 * 0.0068262 * 80 / 30)  # $18.2032
    assert cost.total_usd == cost.early_deletion_usd
    assert action_cost("delete", TB, source=wasabi, days_on_source=90).total_usd == 0.0
    assert action_cost("delete", TB, source=None).total_usd == 0.0


def test_small_objects_are_billed_at_the_minimum_size() -> None:
    assert early_deletion_usd(1000, 0, IA, objects=10) == pytest.approx(
        10 * 131072 / 1e9 * 0.0125 * 30 / 30
    )


def test_every_planned_action_is_priced() -> None:
    """A milestone 20 days old on Glacier IR with a replica on Deep Archive: deleting it
    pays 70 unserved days on the one and 160 on the other; moving it pays retrieval too."""
    c = make_checkpoint(
        7,
        klass="milestone",
        size_bytes=TB,
        tier="cold",
        replicas=("archive",),
        age=timedelta(days=20),
    )
    policy = make_policy(
        rules=[rule("purge", "delete", klass="milestone"), rule("deep", {"move_to": "archive"})]
    )
    run = make_run(status="completed")
    (delete,) = evaluate(policy, run, [c], NOW, tier_ranks=TIER_RANKS).actions
    cost = planned_action_cost(delete, c, PRICES, NOW)
    assert cost.early_deletion_usd == pytest.approx(1000 * (0.004 * 70 + 0.00099 * 160) / 30)
    assert cost.retrieval_usd == 0.0

    move = delete._replace(kind="move", to_tier="archive")
    moved = planned_action_cost(move, c, PRICES, NOW)
    assert moved.retrieval_usd == pytest.approx(30.0)
    assert moved.early_deletion_usd == pytest.approx(1000 * 0.004 * 70 / 30)
    assert planned_action_cost(move, c, FREE, NOW).total_usd == 0.0


def test_every_planned_action_changes_the_bills_of_the_tiers_it_touches() -> None:
    """Per tier, USD a month (bytes / 10^9 x the tier's storage price): a delete frees the
    primary and each replica; a move frees its source and fills its target, unless a
    replica there already is billed; a copy fills its target."""
    c = make_checkpoint(
        7,
        klass="milestone",
        size_bytes=TB,
        tier="cold",
        replicas=("archive",),
        age=timedelta(days=20),
    )
    policy = make_policy(rules=[rule("purge", "delete", klass="milestone")])
    (delete,) = evaluate(
        policy, make_run(status="completed"), [c], NOW, tier_ranks=TIER_RANKS
    ).actions
    price = {name: quote.storage_gb_month for name, quote in PRICES.items()}

    assert planned_storage_change(delete, c, PRICES) == {
        "archive": -1000 * price["archive"],
        "cold": -1000 * price["cold"],
    }
    onto_replica = delete._replace(kind="move", to_tier="archive")
    assert planned_storage_change(onto_replica, c, PRICES) == {
        "cold": -1000 * price["cold"],
        "archive": 0.0,
    }
    move = delete._replace(kind="move", from_tier="hot", to_tier="cold")
    on_hot = c._replace(tier="hot", tiers=frozenset({"hot"}))
    assert planned_storage_change(move, on_hot, PRICES) == {
        "hot": -1000 * price["hot"],
        "cold": 1000 * price["cold"],
    }
    copy = delete._replace(kind="copy", to_tier="warm")
    assert planned_storage_change(copy, c, PRICES) == {"warm": 1000 * price["warm"]}
    free = planned_storage_change(delete, c, FREE)
    assert free == {"archive": 0.0, "cold": 0.0}
    assert all(str(amount) == "0.0" for amount in free.values())  # not -0.0


# --- weighing a demotion ---------------------------------------------------------------------


def test_a_demotion_removed_9_days_later_is_not_worth_it() -> None:
    verdict = weigh_demotion(TB, source=STANDARD, target=GLACIER_IR, days_on_target=9)
    assert verdict.penalty_usd == pytest.approx(1000 * 0.004 * 81 / 30)  # $10.80
    assert verdict.saving_usd == pytest.approx(1000 * (0.023 - 0.004) * 9 / 30)  # $5.70
    assert verdict.skip


def test_a_demotion_removed_29_days_later_is() -> None:
    verdict = weigh_demotion(TB, source=STANDARD, target=GLACIER_IR, days_on_target=29)
    assert verdict.penalty_usd == pytest.approx(1000 * 0.004 * 61 / 30)  # $8.13
    assert verdict.saving_usd == pytest.approx(1000 * 0.019 * 29 / 30)  # $18.37
    assert not verdict.skip


@given(
    days=st.floats(min_value=0, max_value=400),
    source_price=st.floats(min_value=0.0001, max_value=0.1),
    target_price=st.floats(min_value=0.0001, max_value=0.1),
    minimum=st.integers(min_value=1, max_value=365),
)
def test_skip_when_minimum_times_new_price_exceeds_days_times_old_price(
    days: float, source_price: float, target_price: float, minimum: int
) -> None:
    """(M - L) p_T > L (p_S - p_T)  <=>  M p_T > L p_S, while L < M."""
    source = PriceQuote(storage_gb_month=source_price)
    target = PriceQuote(storage_gb_month=target_price, min_storage_days=minimum)
    verdict = weigh_demotion(TB, source=source, target=target, days_on_target=days)
    left, right = minimum * target_price, min(days, minimum) * source_price
    if abs(left - right) > 1e-9 * max(left, right) and days < minimum:
        assert verdict.skip == (left > right)
    if days >= minimum:
        assert verdict.penalty_usd == 0.0


# --- the plan ----------------------------------------------------------------------------------

ENDED_2_DAYS_AGO = make_run(status="completed", ended_ago=timedelta(days=2))
MILESTONE = make_checkpoint(100, klass="milestone", size_bytes=TB)


def plan_with_skips(
    rules: list[dict[str, Any]],
    *,
    run: Any = ENDED_2_DAYS_AGO,
    checkpoints: Any = (MILESTONE,),
    prices: Any = PRICES,
    explain: bool = False,
) -> Plan:
    policy = make_policy(rules=rules)
    plan = evaluate(policy, run, list(checkpoints), NOW, tier_ranks=TIER_RANKS, explain=explain)
    return skip_costly_demotions(
        plan, policy, run, list(checkpoints), NOW, tier_ranks=TIER_RANKS, prices=prices
    )


COOL = rule("cool", {"move_to": "cold"}, klass="milestone", when={"run_ended": "1d"})


def test_a_demotion_deleted_before_the_minimum_is_skipped_with_its_figures() -> None:
    purge = rule("purge", "delete", klass="milestone", when={"run_ended": "11d"})  # in 9 days

    plan = plan_with_skips([COOL, purge])

    assert plan.actions == ()
    (skipped,) = plan.skipped
    assert skipped.checkpoint_id == MILESTONE.id
    assert skipped.rule == "pol/cool"
    assert skipped.reason == (
        "early deletion: purge would remove it from cold 9 days after the move, before its "
        "90-day minimum; the unserved 81 days cost $10.80, more than the $5.70 the move saves"
    )


def test_a_demotion_deleted_after_enough_days_goes_ahead() -> None:
    purge = rule("purge", "delete", klass="milestone", when={"run_ended": "31d"})  # in 29 days

    plan = plan_with_skips([COOL, purge])

    assert [(a.kind, a.to_tier) for a in plan.actions] == [("move", "cold")]
    assert plan.skipped == ()


def test_a_later_move_elsewhere_also_ends_the_stay() -> None:
    deeper = rule("deeper", {"move_to": "archive"}, klass="milestone", when={"run_ended": "11d"})

    plan = plan_with_skips([COOL, deeper])

    assert plan.actions == ()
    assert "deeper would remove it from cold 9 days after" in plan.skipped[0].reason


def test_age_counts_on_a_running_run() -> None:
    """An active run never ends on time alone, but a checkpoint still ages."""
    run = make_run(status="active")
    young = make_checkpoint(100, klass="milestone", size_bytes=TB, age=timedelta(days=2))
    newest = make_checkpoint(200, klass="rolling", age=timedelta(hours=1))  # the resume point
    rules = [
        rule("cool", {"move_to": "cold"}, klass="milestone", when={"age": "1d"}),
        rule("purge", "delete", klass="milestone", when={"age": "10d"}),  # in 8 days
    ]

    plan = plan_with_skips(rules, run=run, checkpoints=(young, newest))

    assert [s.checkpoint_id for s in plan.skipped] == [young.id]
    assert "8 days after the move" in plan.skipped[0].reason


def test_a_removal_that_waits_for_the_run_to_end_does_not_count_while_it_runs() -> None:
    run = make_run(status="active")
    young = make_checkpoint(100, klass="milestone", size_bytes=TB, age=timedelta(days=2))
    newest = make_checkpoint(200, klass="rolling", age=timedelta(hours=1))
    rules = [
        rule("cool", {"move_to": "cold"}, klass="milestone", when={"age": "1d"}),
        rule("purge", "delete", klass="milestone", when={"run_ended": "0s"}),
    ]

    plan = plan_with_skips(rules, run=run, checkpoints=(young, newest))

    assert [(a.checkpoint_id, a.kind) for a in plan.actions] == [(young.id, "move")]


def test_a_removal_only_on_the_new_tier_does_not_count() -> None:
    """Skipping would leave the checkpoint on hot for good: the rule needs it on cold."""
    purge = rule(
        "purge", "delete", klass="milestone", when={"run_ended": "11d", "on_tier": ["cold"]}
    )

    plan = plan_with_skips([COOL, purge])

    assert [a.kind for a in plan.actions] == ["move"]


def test_a_checkpoint_the_remover_keeps_is_not_removed() -> None:
    purge = rule("purge", "delete", klass="milestone", when={"run_ended": "11d"}, keep_last=1)

    plan = plan_with_skips([COOL, purge])

    assert [a.kind for a in plan.actions] == ["move"]


def test_keep_within_counts_from_when_it_lets_go() -> None:
    created = make_checkpoint(100, klass="milestone", size_bytes=TB, age=timedelta(days=5))
    purge = rule("purge", "delete", klass="milestone", keep_within="15d")  # lets go in 10 days

    plan = plan_with_skips([COOL, purge], checkpoints=(created,))

    assert "10 days after the move" in plan.skipped[0].reason


def test_without_a_minimum_duration_the_plan_is_untouched() -> None:
    policy = make_policy(
        rules=[COOL, rule("purge", "delete", klass="milestone", when={"run_ended": "3d"})]
    )
    plan = evaluate(policy, ENDED_2_DAYS_AGO, [MILESTONE], NOW, tier_ranks=TIER_RANKS)

    result = skip_costly_demotions(
        plan, policy, ENDED_2_DAYS_AGO, [MILESTONE], NOW, tier_ranks=TIER_RANKS, prices=FREE
    )

    assert result is plan


def test_the_kept_checkpoint_says_why_it_stays() -> None:
    purge = rule("purge", "delete", klass="milestone", when={"run_ended": "11d"})

    plan = plan_with_skips([COOL, purge], explain=True)

    (kept,) = plan.kept
    assert kept.reasons[-1].startswith("early deletion: purge would remove it from cold")


def test_only_the_costly_demotion_of_several_is_skipped() -> None:
    """Two milestones: the older one expires 9 days after the move, the newer one later."""
    old = make_checkpoint(100, klass="milestone", size_bytes=TB, age=timedelta(days=50))
    new = make_checkpoint(200, klass="milestone", size_bytes=TB, age=timedelta(days=30))
    rules = [COOL, rule("purge", "delete", klass="milestone", when={"age": "59d"})]

    plan = plan_with_skips(rules, checkpoints=(old, new))

    assert [s.checkpoint_id for s in plan.skipped] == [old.id]  # removed in 9 days
    assert [(a.checkpoint_id, a.kind) for a in plan.actions] == [(new.id, "move")]  # in 29
