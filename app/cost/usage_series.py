"""Bytes per tier over time, from the changes that made them: one calendar day (UTC) per
entry of the series, each at the day's end, and what storing them cost over a window.

A backtest computes what the candidate would have stored and what was actually stored
this one way, so the two can only differ by what happened to the bytes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from types import MappingProxyType

from app.cost.backtest import Delta
from app.cost.prices import MONTH_DAYS, PriceQuote

MONTH_SECONDS = MONTH_DAYS * 86_400


@dataclass(frozen=True, slots=True)
class DayPoint:
    day: date
    bytes_by_tier: Mapping[str, int]
    usd_month: float

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_tier.values())


@dataclass(frozen=True, slots=True)
class UsageSeries:
    series: tuple[DayPoint, ...]
    total_usd: float  # storage over the window, at each tier's price


def usage_series(
    deltas: Iterable[Delta],
    prices: Mapping[str, PriceQuote],
    tiers: Iterable[str],
    since: datetime,
    until: datetime,
) -> UsageSeries:
    """The usage on each day from `since` to `until` (the last day ends at `until`), and the
    storage bill over that window (no day at all when `until` is not after `since`).
    Changes at `until` or after are left out."""
    stored = dict.fromkeys(tiers, 0)
    changes = sorted((d for d in deltas if d.at < until), key=lambda d: d.at)
    rate = 0.0
    clock = since
    total = 0.0
    series: list[DayPoint] = []
    if until <= since:
        return UsageSeries((), 0.0)
    day = since.date()
    i = 0

    def price() -> float:
        return sum(prices[t].usd_month(b) for t, b in stored.items() if b and t in prices)

    while True:
        end = min(datetime.combine(day + timedelta(days=1), time(), since.tzinfo), until)
        # a day's figure is its usage just before midnight: what the evaluation at the
        # boundary itself does belongs to the next day (the last day ends at `until`)
        while i < len(changes) and (changes[i].at < end or (end == until and changes[i].at == end)):
            change = changes[i]
            if change.at > clock:
                total += rate * (change.at - clock).total_seconds() / MONTH_SECONDS
                clock = change.at
            stored[change.tier] = stored.get(change.tier, 0) + change.bytes
            rate = price()
            i += 1
        if end > clock:
            total += rate * (end - clock).total_seconds() / MONTH_SECONDS
            clock = end
        series.append(DayPoint(day, MappingProxyType(dict(stored)), rate))
        if end >= until:
            break
        day += timedelta(days=1)
    return UsageSeries(tuple(series), total)
