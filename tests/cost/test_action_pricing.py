"""An explained plan prices its actions through `ActionPricer`, which works out once per
plan what depends only on an action's tiers. Whatever it keeps, every action must be
priced to the same float as the plain model of the rules (pricing_model) prices it one at
a time: a plan's figures, its totals and its JSON are built from them."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.cost.action_pricing import ActionPricer
from app.cost.prices import PriceQuote
from app.domain.plan import CheckpointSnapshot, PlannedAction
from tests.cost.pricing_model import planned_action_cost, planned_storage_change
from tests.unit.engine_builders import NOW, make_checkpoint

TIERS = ("hot", "warm", "cold", "archive")
price = st.sampled_from([0.0, 0.00099, 0.004, 0.0125, 0.023, 0.1])

quotes = st.builds(
    PriceQuote,
    storage_gb_month=price,
    retrieval_gb=price,
    egress_gb=price,
    min_storage_days=st.sampled_from([0, 30, 90, 180]),
    min_object_bytes=st.sampled_from([0, 128 * 1024]),
    write_requests_per_1000=price,
    read_requests_per_1000=price,
    network=st.sampled_from(["aws", "gcp"]),
)
# some tiers unpriced (absent), as a tier with no catalog entry and no figures would be
price_lists = st.dictionaries(st.sampled_from(TIERS), quotes)


@st.composite
def priced_actions(draw: st.DrawFn) -> tuple[PlannedAction, CheckpointSnapshot]:
    tier = draw(st.sampled_from([*TIERS, None]))
    replicas = draw(st.lists(st.sampled_from(TIERS), max_size=3, unique=True))
    checkpoint = make_checkpoint(
        draw(st.integers(1, 10_000)),
        size_bytes=draw(st.sampled_from([0, 1, 10**6, 10**9 + 7, 10**12])),
        # around each minimum storage duration: just short of it, on it, past it
        age=timedelta(days=draw(st.sampled_from([0, 1, 29.999, 30, 30.001, 89.5, 90, 200]))),
        tier=tier,
        replicas=replicas,
    )
    kind = draw(st.sampled_from(["delete", "move", "copy"]))
    to_tier = draw(st.sampled_from([*TIERS, None])) if kind != "delete" else None
    action = PlannedAction(
        checkpoint_id=checkpoint.id,
        run_id=checkpoint.run_id,
        step=checkpoint.step,
        kind=kind,
        from_tier=tier,
        to_tier=to_tier,
        rule="p/r",
        reason="r",
        bytes=checkpoint.size_bytes,
    )
    return action, checkpoint


@given(prices=price_lists, actions=st.lists(priced_actions(), min_size=1, max_size=12))
def test_every_action_is_priced_as_the_plain_model_prices_it(
    prices: dict[str, PriceQuote], actions: list[tuple[PlannedAction, CheckpointSnapshot]]
) -> None:
    """One pricer for many actions, as a plan uses it: combinations repeat with other
    sizes and ages, and each is priced by its own."""
    pricer = ActionPricer(prices, NOW)
    for action, checkpoint in actions:
        cost, change = pricer.price(action, checkpoint)
        expected_cost = planned_action_cost(action, checkpoint, prices, NOW)
        expected_change = tuple(planned_storage_change(action, checkpoint, prices).items())
        # repr: the same floats, -0.0 apart from 0.0 and in the same order of tiers
        assert repr(cost) == repr(expected_cost)
        assert repr(change) == repr(expected_change)


def test_a_combination_seen_before_is_priced_by_the_new_actions_size_and_age() -> None:
    """What the pricer keeps is per combination of tiers, never an earlier action's
    figures: the same delete of a 1 TB and of a 2 TB checkpoint, both 10 days into a
    90-day minimum, owes twice as much for the second."""
    prices = {"cold": PriceQuote(storage_gb_month=0.004, min_storage_days=90)}
    pricer = ActionPricer(prices, NOW)
    owed = []
    for size in (10**12, 2 * 10**12):
        checkpoint = make_checkpoint(1, size_bytes=size, age=timedelta(days=10), tier="cold")
        action = PlannedAction(
            checkpoint.id, checkpoint.run_id, 1, "delete", "cold", None, "p/r", "r", size
        )
        cost, change = pricer.price(action, checkpoint)
        owed.append((cost.early_deletion_usd, change))
    assert owed[0][0] > 0
    assert owed[1][0] == 2 * owed[0][0]
    assert owed[1][1] == (("cold", 2 * owed[0][1][0][1]),)
    # once the minimum is served, nothing is owed
    served = make_checkpoint(1, size_bytes=10**12, age=timedelta(days=90), tier="cold")
    action = PlannedAction(served.id, served.run_id, 1, "delete", "cold", None, "p/r", "r", 10**12)
    assert pricer.price(action, served)[0].total_usd == 0.0
