"""Builders for the cost tests: tiers with prices, and the worked example of section 1."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from app.cost.forecast import ForecastSpec
from app.cost.prices import PriceQuote
from app.domain.tier import Price, Tier
from app.policy.schema import Policy

SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
TIER_NAMES = ("hot", "warm", "cold", "archive")
TB = 10**12
USD_PER_TB_MONTH = 23.0  # section 1: hot object storage at $23 per TB-month

# Section 1: a 70B model, 1 TB checkpoints, a 45-day run; 3 rolling (every 3 h), one
# milestone a day, one final at the end.
EXAMPLE_SCHEDULE: tuple[tuple[str, timedelta | None], ...] = (
    ("rolling", timedelta(hours=3)),
    ("milestone", timedelta(days=1)),
    ("final", None),
)


def tier(
    name: str = "t",
    url: str = "s3://bucket/prefix",
    *,
    rank: int = 0,
    storage_class: str | None = None,
    endpoint_url: str | None = None,
    **price: Any,
) -> Tier:
    """A tier whose price sets only the figures given here (and may name a `catalog` entry);
    the others are None: the catalog's defaults."""
    return Tier(
        name=name,
        url=url,
        rank=rank,
        storage_class=storage_class,
        endpoint_url=endpoint_url,
        price=Price(**price),
    )


def local_tiers() -> list[Tier]:
    return [
        tier(name, f"file:///srv/ckpt/{name}", rank=rank) for rank, name in enumerate(TIER_NAMES)
    ]


def flat_prices(usd_per_gb_month: float = USD_PER_TB_MONTH / 1000) -> dict[str, PriceQuote]:
    return {name: PriceQuote(storage_gb_month=usd_per_gb_month) for name in TIER_NAMES}


def shipped_policy() -> Policy:
    document = yaml.safe_load(SHIPPED_POLICY.read_text())
    return Policy.model_validate(document, context={"tiers": list(TIER_NAMES)})


def policy(document: dict[str, Any]) -> Policy:
    return Policy.model_validate(document, context={"tiers": list(TIER_NAMES)})


def example_spec(**changes: Any) -> ForecastSpec:
    values: dict[str, Any] = {
        "checkpoint_bytes": TB,
        "run_days": 45,
        "schedule": EXAMPLE_SCHEDULE,
    }
    values.update(changes)
    return ForecastSpec(**values)
