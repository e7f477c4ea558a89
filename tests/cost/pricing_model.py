"""How one planned action is priced, written plainly, one action at a time: the model an
explained plan's `ActionPricer` (app/cost/action_pricing.py), which works out what
combinations of tiers share once per plan, is held to, float for float."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from app.cost.early_deletion import DAY_SECONDS, ActionCost, action_cost, early_deletion_usd
from app.cost.prices import PriceQuote
from app.domain.plan import CheckpointSnapshot, PlannedAction


def planned_action_cost(
    action: PlannedAction,
    checkpoint: CheckpointSnapshot,
    prices: Mapping[str, PriceQuote],
    now: datetime,
) -> ActionCost:
    """What a planned action will cost: a delete pays early deletion on every tier holding
    the checkpoint; a move or copy reads its primary tier. Time on a tier is counted from
    the checkpoint's `created_at` (exact for a checkpoint never moved; a moved one may be
    charged less than it will be). Tiers without a price cost nothing."""
    days = max(0.0, (now - checkpoint.created_at).total_seconds() / DAY_SECONDS)
    if action.kind == "delete":
        early = 0.0  # summed in the tiers' order, as a total of per-tier charges would be
        for tier in sorted(held_tiers(checkpoint)):
            quote = prices.get(tier)
            if quote is not None:
                early += early_deletion_usd(action.bytes, days, quote)
        return ActionCost(early_deletion_usd=early)
    return action_cost(
        action.kind,
        action.bytes,
        source=prices.get(action.from_tier or ""),
        target=prices.get(action.to_tier or ""),
        days_on_source=days,
    )


def held_tiers(checkpoint: CheckpointSnapshot) -> Collection[str]:
    """Every tier holding the checkpoint (a catalog's snapshot lists its primary among
    them already: then no new set per action of a million-checkpoint plan)."""
    tier = checkpoint.tier
    if not tier or tier in checkpoint.tiers:
        return checkpoint.tiers
    return checkpoint.tiers | {tier}


def planned_storage_change(
    action: PlannedAction, checkpoint: CheckpointSnapshot, prices: Mapping[str, PriceQuote]
) -> dict[str, float]:
    """USD a month each tier's storage bill changes by once a planned action is done (never
    rounded): a delete frees every location (the primary and each replica), counted from
    its purge, since trashed bytes are billed until then; a move frees its source and fills
    its target (unless a replica there already is billed, and becomes the primary); a copy
    fills its target. A tier without a price changes by 0 but is still listed."""
    size = action.bytes

    def usd(tier: str) -> float:
        quote = prices.get(tier)
        return quote.usd_month(size) if quote is not None else 0.0

    held = held_tiers(checkpoint)
    change: dict[str, float] = {}
    if action.kind == "delete":
        for tier in sorted(held or {action.from_tier or "?"}):
            change[tier] = -usd(tier)
    elif action.kind in ("move", "copy") and action.to_tier is not None:
        if action.kind == "move":
            source = action.from_tier or "?"
            change[source] = -usd(source)
        change[action.to_tier] = 0.0 if action.to_tier in held else usd(action.to_tier)
    # 0 - 0.0 is -0.0, which JSON spells "-0.0": a free tier's change is plain 0.
    return {tier: amount + 0.0 for tier, amount in change.items()}
