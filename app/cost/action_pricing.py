"""What each planned action of an explained plan costs once, and how it changes each
tier's monthly bill (section 7b), with what depends only on the action's tiers worked out
once per plan.

A plan of a million checkpoints prices 200,000 actions, and they share a handful of
(kind, source, target, tiers held) combinations: looking up their prices, sorting the
tiers held and building a closure for each action was a fifth of an explained range's
evaluation. Per action there remains what depends on it: its size and its days on the
tier. A plain one-action-at-a-time model of the same rules (tests/cost/pricing_model.py)
holds every figure to the same float.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import NamedTuple

from app.cost.early_deletion import DAY_SECONDS, ActionCost, action_cost, early_deletion_usd
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
        """(what the action costs once, how it changes each tier's bill: USD a month per
        tier, never rounded).

        The cost: a delete pays early deletion on every tier holding the checkpoint; a move
        or a copy reads its primary tier (`action_cost`). Time on a tier is counted from
        the checkpoint's `created_at` (exact for a checkpoint never moved; a moved one may
        be charged less than it will be). Tiers without a price cost nothing.

        The bills: a delete frees every location (the primary and each replica), counted
        from its purge, since trashed bytes are billed until then; a move frees its source
        and fills its target (unless a replica there is already billed, and becomes the
        primary); a copy fills its target. A tier without a price changes by 0 but is
        still listed, as plain 0 (0 - 0.0 is -0.0, which JSON spells "-0.0")."""
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
        held = _held(checkpoint)
        # summed in the tiers' order, as a total of per-tier charges would be
        quotes = tuple(q for t in sorted(held) if (q := prices.get(t)) is not None)
        # tier by tier (a later entry for a tier replaces an earlier one in place)
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


def _held(checkpoint: CheckpointSnapshot) -> Collection[str]:
    """Every tier holding the checkpoint (a catalog's snapshot lists its primary among
    them already: then no new set)."""
    tier = checkpoint.tier
    if not tier or tier in checkpoint.tiers:
        return checkpoint.tiers
    return checkpoint.tiers | {tier}
