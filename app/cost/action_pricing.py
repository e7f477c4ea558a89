"""The planned actions of an explained plan priced as `planned_action_cost` and
`planned_storage_change` price them, with what depends only on an action's tiers worked
out once per plan.

A plan of a million checkpoints prices 200,000 actions, and they share a handful of
(kind, source, target, tiers held) combinations: looking up their prices, sorting the
tiers held and building a closure for each action was a fifth of an explained range's
evaluation. Per action there remains what depends on it: its size and its days on the
tier. The arithmetic is the reference functions' own, in their order, so every figure is
the same float (a property test holds them to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from app.cost.early_deletion import (
    DAY_SECONDS,
    ActionCost,
    action_cost,
    early_deletion_usd,
    held_tiers,
)
from app.cost.prices import PriceQuote
from app.domain.plan import CheckpointSnapshot, PlannedAction

StorageChange = tuple[tuple[str, float], ...]  # (tier, USD a month), as a plan carries it
FREE = ActionCost()


class _Recipe(NamedTuple):
    """What pricing one combination needs, worked out once."""

    delete: bool
    # a delete: the priced tiers holding the checkpoint in name order, and the longest
    # minimum storage duration among them (no charge once that many days are served)
    held: tuple[PriceQuote, ...]
    longest_min_days: float
    # a move or a copy: the quotes `action_cost` is given
    source: PriceQuote | None
    target: PriceQuote | None
    # the storage change, tier by tier: (tier, freed (a negative change), its quote; None
    # when the tier is unpriced or nothing changes there)
    change: tuple[tuple[str, bool, PriceQuote | None], ...]


class ActionPricer:
    """Prices the actions of one plan (one set of prices, one `now`)."""

    def __init__(self, prices: Mapping[str, PriceQuote], now: datetime) -> None:
        self.prices = prices
        self.now = now
        self._recipes: dict[
            tuple[str, str | None, str | None, str | None, frozenset[str]], _Recipe
        ] = {}

    def price(
        self, action: PlannedAction, checkpoint: CheckpointSnapshot
    ) -> tuple[ActionCost, StorageChange]:
        """(`planned_action_cost`, the items of `planned_storage_change`) of the action."""
        key = (action.kind, action.from_tier, action.to_tier, checkpoint.tier, checkpoint.tiers)
        recipe = self._recipes.get(key)
        if recipe is None:
            recipe = self._recipes[key] = self._recipe(action, checkpoint)
        size = action.bytes
        days = max(0.0, (self.now - checkpoint.created_at).total_seconds() / DAY_SECONDS)
        if recipe.delete:
            if days >= recipe.longest_min_days:
                cost = FREE  # every minimum served: each tier's charge is 0.0, and so is their sum
            else:
                early = 0.0
                for quote in recipe.held:
                    early += early_deletion_usd(size, days, quote)
                cost = ActionCost(early_deletion_usd=early)
        else:
            cost = action_cost(
                action.kind, size, source=recipe.source, target=recipe.target, days_on_source=days
            )
        change = tuple(
            (tier, (-quote.usd_month(size) if freed else quote.usd_month(size)) + 0.0)
            if quote is not None
            else (tier, 0.0)
            for tier, freed, quote in recipe.change
        )
        return cost, change

    def _recipe(self, action: PlannedAction, checkpoint: CheckpointSnapshot) -> _Recipe:
        prices = self.prices
        held = held_tiers(checkpoint)
        quotes = tuple(q for t in sorted(held) if (q := prices.get(t)) is not None)
        # the storage change, as planned_storage_change builds it (later entries of a tier
        # replace earlier ones in place, as a dictionary's do)
        change: dict[str, tuple[bool, PriceQuote | None]] = {}
        if action.kind == "delete":
            for tier in sorted(held or {action.from_tier or "?"}):
                change[tier] = (True, prices.get(tier))
        elif action.kind in ("move", "copy") and action.to_tier is not None:
            if action.kind == "move":
                source = action.from_tier or "?"
                change[source] = (True, prices.get(source))
            target = action.to_tier
            change[target] = (False, None if target in held else prices.get(target))
        return _Recipe(
            delete=action.kind == "delete",
            held=quotes,
            longest_min_days=max((q.min_storage_days for q in quotes), default=0),
            source=prices.get(action.from_tier or ""),
            target=prices.get(action.to_tier or ""),
            change=tuple((tier, freed, quote) for tier, (freed, quote) in change.items()),
        )
