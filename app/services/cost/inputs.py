"""What the cost endpoints and commands read before they compute: the policy a forecast
replays (a stored one by name, or a document inline), tier prices with what-if overrides,
and how long each tier's provider bills deleted bytes, with what-if overrides too. Raises
Invalid naming the field at fault."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.cost.prices import (
    FIGURES,
    PriceQuote,
    catalog_quote,
    effective_price,
    known_entry,
    unknown_entry_message,
    with_figures,
)
from app.domain.duration import parse_duration
from app.domain.errors import Invalid
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.catalog.policies import resolve_policy as resolve_stored_or_inline

DEFAULT_POLICY = "default"


def resolve_policy(
    session: Session | None, tiers: Sequence[Tier], policy: str | Mapping[str, Any] | None
) -> Policy:
    """A stored policy by name (the one named `default` when None), or an inline policy
    document validated against the tiers. Without a session only inline documents work.
    The default stands for the runs no other policy governs: a `default` in shadow mode
    governs none, so it is no default (named, a shadow policy resolves like any other)."""
    names = [t.name for t in tiers]
    chosen = DEFAULT_POLICY if policy is None else policy
    resolved = resolve_stored_or_inline(session, names, chosen, message_names_field=False)
    if policy is None and not resolved.enforced:
        raise Invalid(
            f"the policy named {DEFAULT_POLICY!r} is a shadow policy and governs no run: "
            "name the policy to use",
            field="policy",
        )
    return resolved


EVERY_TIER = "*"


def tier_prices(
    tiers: Sequence[Tier], overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, PriceQuote]:
    """Each tier's effective price, with what-if overrides per tier: `catalog` (the tier
    priced as that entry instead) and any price figure over it.

    `*` overrides every tier, and a tier's own entry is layered over it whatever their
    order: a figure the tier sets wins, and a `catalog` it names starts it afresh from that
    entry (only the tier's own figures then apply over it). The HTTP API and the command
    line both come here, so `"prices": {"*": ...}` and `--price '*=...'` mean one thing."""
    prices = {t.name: effective_price(t) for t in tiers}
    overrides = overrides or {}
    for name in overrides:
        if name != EVERY_TIER and name not in prices:
            raise Invalid(
                f"unknown tier {name!r}; configured tiers: {', '.join(prices)}",
                field=f"prices.{name}",
            )
    every = overrides.get(EVERY_TIER)
    for name in prices:
        own = overrides.get(name)
        if own is None and every is None:
            continue
        if own is not None and own.get("catalog") is not None:
            prices[name] = _override(prices[name], own, field=f"prices.{name}")
            continue
        quote = _override(prices[name], every or {}, field=f"prices.{EVERY_TIER}")
        prices[name] = _override(quote, own or {}, field=f"prices.{name}")
    return prices


def tier_billing(
    tiers: Sequence[Tier], overrides: Mapping[str, str | None] | None = None
) -> dict[str, timedelta | None]:
    """How long each tier's provider keeps billing deleted bytes (GCS soft delete, noncurrent
    versions; None: for ever), as its provider settings say, with what-if overrides: a
    duration (`0s`: a bucket that forgets at once) or None (for ever), per tier or `*` for
    every tier, a tier's own entry winning over `*`. So one service answers the same
    forecast with and without soft delete."""
    billed = {t.name: t.provider.billed_after_delete for t in tiers}
    overrides = overrides or {}
    parsed: dict[str, timedelta | None] = {}
    for name, value in overrides.items():
        field = f"billed_after_delete.{name}"
        if name != EVERY_TIER and name not in billed:
            raise Invalid(
                f"unknown tier {name!r}; configured tiers: {', '.join(billed)}", field=field
            )
        try:
            parsed[name] = None if value is None else parse_duration(value)
        except ValueError as error:
            raise Invalid(str(error), field=field) from None
    for name in billed:
        if name in parsed:
            billed[name] = parsed[name]
        elif EVERY_TIER in parsed:
            billed[name] = parsed[EVERY_TIER]
    return billed


def _override(quote: PriceQuote, override: Mapping[str, Any], *, field: str) -> PriceQuote:
    named = override.get("catalog")
    if named is not None:
        key = known_entry(named)
        if key is None:
            raise Invalid(unknown_entry_message(named), field=f"{field}.catalog")
        quote = catalog_quote(key)
    figures = {k: v for k, v in override.items() if k in FIGURES and v is not None}
    return with_figures(quote, figures) if figures else quote
