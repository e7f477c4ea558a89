"""Forecasts (section 7b): what one run, or N runs started together, will store and cost
under a policy, day by day, beside keeping everything on the hottest tier.

The real policy engine is replayed over simulated checkpoints, evaluated after every
registration, when the run ends and at each day boundary, as the service would; demotions
not worth their early-deletion penalty are skipped as a sweep skips them. Actions happen
at once: held deletes count as approved and deleted bytes are freed at once, unless the
tier's provider keeps billing them (soft delete, noncurrent versions). Concurrent
runs start together on one schedule and a rule only ever acts within one run, so N runs
are one replay times N. Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType

from app.cost.prices import PriceQuote
from app.cost.replay import Replay
from app.cost.scenarios import (
    ASSUMPTIONS,
    DAY,
    IMPROVING,
    MAX_DAYS,
    MAX_WORK,
    MAX_WRITES,
    MISSING,
    MONTH_SECONDS,
    START,
    DayUsage,
    Forecast,
    ForecastSpec,
    Metrics,
    Scenario,
    Usage,
)
from app.domain.errors import Invalid
from app.domain.tier import Tier
from app.policy.schema import Policy


def planned_writes(spec: ForecastSpec) -> list[tuple[timedelta, str]]:
    """(time since the start, class) of every checkpoint one run writes, in write order:
    k x interval for k = 1 .. floor(run / interval), or once at the end; equal times in
    schedule order. Raises Invalid beyond MAX_WRITES."""
    run = spec.run_days * DAY
    counts = [1 if every is None else run // every for _klass, every in spec.schedule]
    if sum(counts) > MAX_WRITES:
        raise Invalid(
            f"the schedule writes {sum(counts):,} checkpoints per run; at most {MAX_WRITES:,}",
            field="schedule",
        )
    out: list[tuple[timedelta, int, str]] = []
    for order, ((klass, every), count) in enumerate(zip(spec.schedule, counts, strict=True)):
        if every is None:
            out.append((run, order, klass))
        else:
            out.extend((every * k, order, klass) for k in range(1, count + 1))
    out.sort()
    return [(t, klass) for t, _order, klass in out]


def forecast(
    spec: ForecastSpec,
    policy: Policy,
    tiers: Sequence[Tier],
    prices: Mapping[str, PriceQuote],
    billed_after_delete: Mapping[str, timedelta | None] | None = None,
) -> Forecast:
    """Replay `policy` over the simulated runs, and price keeping everything beside it.

    `billed_after_delete` says per tier how long its provider bills deleted bytes (None: for
    ever), a what-if over the tiers' own provider settings for the tiers it names."""
    if not tiers:
        raise Invalid("no tiers are configured", field="tiers")
    ordered = sorted(tiers, key=lambda t: t.rank)
    writes = planned_writes(spec)
    replay = Replay(spec, policy, ordered, prices, billed_after_delete)
    with_policy = replay.play(writes)
    written: dict[str, int] = {klass: 0 for klass, _every in spec.schedule}
    for _t, klass in writes:
        written[klass] += 1
    notes = (*ASSUMPTIONS, IMPROVING if spec.metrics == "improving" else MISSING)
    return Forecast(
        policy=policy.name,
        spec=spec,
        written=MappingProxyType(written),
        with_policy=with_policy,
        keep_everything=keep_everything(spec, ordered, prices, writes),
        skipped_demotions=len(replay.skipped),
        assumptions=notes,
    )


def keep_everything(
    spec: ForecastSpec,
    tiers: Sequence[Tier],
    prices: Mapping[str, PriceQuote],
    writes: Sequence[tuple[timedelta, str]],
) -> Scenario:
    """No policy: every checkpoint written stays on the hottest tier."""
    hot = tiers[0].name
    price = prices[hot]
    each = spec.checkpoint_bytes * spec.concurrent_runs
    times = [t for t, _klass in writes]

    def usage(count: int) -> Usage:
        by_tier = {t.name: 0 for t in tiers}
        by_tier[hot] = count * each
        return Usage(MappingProxyType(by_tier), price.usd_month(count * each))

    horizon = spec.horizon * DAY
    series = tuple(
        DayUsage(day, usage(bisect_right(times, day * DAY))) for day in range(1, spec.horizon + 1)
    )
    stored = sum((horizon - t).total_seconds() for t in times if t < horizon)
    storage_usd = price.usd_month(each) * stored / MONTH_SECONDS
    return Scenario(series, usage(len(times)), storage_usd)


__all__ = [
    "DAY",
    "MAX_DAYS",
    "MAX_WORK",
    "MAX_WRITES",
    "START",
    "DayUsage",
    "Forecast",
    "ForecastSpec",
    "Metrics",
    "Scenario",
    "Usage",
    "forecast",
    "keep_everything",
    "planned_writes",
]
