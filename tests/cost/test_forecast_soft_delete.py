"""Forecasts on a tier whose provider bills deleted bytes (GCS soft delete, noncurrent versions,
DESIGN section 16): the policy decides the same, and what it deletes or moves off such a tier
stays on the bill for the tier's window (to the horizon when for ever).

The worked example of section 1 on a GCS tier with the default 7-day soft delete, beside the
same tier without it: the extra is worked here from the schedule and the shipped policy's
rules, not read off the output."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cost.forecast import DAY, Forecast, ForecastSpec, forecast, planned_writes
from app.domain.provider import ProviderSettings
from app.domain.tier import Tier
from app.policy.schema import Policy, Rule
from tests.cost.helpers import (
    TB,
    TIER_NAMES,
    USD_PER_TB_MONTH,
    example_spec,
    flat_prices,
    local_tiers,
    shipped_policy,
)
from tests.cost.test_forecast import POLICIES

SOFT_DELETE = timedelta(days=7)  # GCS's default soft delete retention
USD_PER_TB_DAY = USD_PER_TB_MONTH / 30


def gcs_tiers(soft_delete: timedelta = SOFT_DELETE) -> list[Tier]:
    """The local tiers, `hot` made a GCS bucket with soft delete (as the tiers file states
    `soft_delete: 7d`)."""
    hot, *rest = local_tiers()
    provider = ProviderSettings(soft_delete=soft_delete, source="tiers file")
    return [replace(hot, url="gs://ckpt-hot/prod", provider=provider), *rest]


def rule(policy: Policy, name: str) -> Rule:
    return next(r for r in policy.rules if r.name == name)


def removals_from_hot(spec: ForecastSpec, policy: Policy) -> list[tuple[timedelta, int]]:
    """(time since the start, checkpoints) of everything the shipped policy takes off `hot`,
    from its rules and the schedule: each rolling checkpoint beyond `keep_last` goes when the
    one `keep_last` later is written; at `run_ended` of the thinning rule every milestone
    but the `keep_best` count goes (metrics improve: the best are the latest, the last among
    them); at `run_ended` of the cooling rule those move to cold (off hot too)."""
    keep = rule(policy, "rolling-keep-3").keep_last
    thin = rule(policy, "milestones-thin")
    thinned, cooled = thin.when.run_ended, rule(policy, "milestones-cold").when.run_ended
    assert keep is not None and thin.keep_best is not None
    assert thinned is not None and cooled is not None
    best = thin.keep_best.count
    writes = planned_writes(spec)
    rolled = [t for t, klass in writes if klass == "rolling"]
    milestones = sum(1 for _t, klass in writes if klass == "milestone")
    run_end = spec.run_days * DAY
    return [
        *[(t, 1) for t in rolled[keep:]],
        (run_end + thinned, milestones - best),
        (run_end + cooled, best),
    ]


def billed_at(removed: list[tuple[timedelta, int]], moment: timedelta) -> int:
    """Checkpoints removed from hot still billed at `moment` (released at removal + 7 d)."""
    return sum(n for t, n in removed if t <= moment < t + SOFT_DELETE)


def test_the_worked_example_on_a_gcs_tier_with_7_day_soft_delete() -> None:
    spec, policy = example_spec(), shipped_policy()
    plain = forecast(spec, policy, local_tiers(), flat_prices())
    soft = forecast(spec, policy, gcs_tiers(), flat_prices())
    removed = removals_from_hot(spec, policy)
    horizon = spec.horizon * DAY

    # Without soft delete, the worked example as section 1 has it.
    assert plain.with_policy.at_run_end.bytes == 49 * TB
    assert plain.with_policy.at_run_end.usd_month == pytest.approx(1127.0)
    assert plain.with_policy.at_run_end.deleted_billed_bytes == 0

    # The policy does the same; the bill keeps each removal 7 more days.
    end = soft.with_policy.at_run_end
    extra_at_end = billed_at(removed, spec.run_days * DAY)
    assert extra_at_end == 7 * 8  # 8 rolling checkpoints deleted a day, for 7 days
    assert end.bytes_by_tier == plain.with_policy.at_run_end.bytes_by_tier
    assert end.deleted_billed_by_tier == {
        "hot": extra_at_end * TB,
        "warm": 0,
        "cold": 0,
        "archive": 0,
    }
    assert end.usd_month == pytest.approx((49 + extra_at_end) * USD_PER_TB_MONTH)
    for with_soft, without in zip(soft.with_policy.series, plain.with_policy.series, strict=True):
        assert with_soft.usage.bytes_by_tier == without.usage.bytes_by_tier
        billed = billed_at(removed, with_soft.day * DAY)
        assert with_soft.usage.deleted_billed_bytes == billed * TB, with_soft.day
        assert with_soft.usage.usd_month == pytest.approx(
            without.usage.usd_month + billed * USD_PER_TB_MONTH
        )

    tb_days = sum(n * (min(t + SOFT_DELETE, horizon) - t) / DAY for t, n in removed if t < horizon)
    assert tb_days == (357 + 40) * 7  # the day-75 move is billed from the horizon on
    extra_usd = tb_days * USD_PER_TB_DAY
    assert soft.with_policy.deleted_billed_usd == pytest.approx(extra_usd)
    assert soft.with_policy.total_usd == pytest.approx(plain.with_policy.total_usd + extra_usd)
    assert soft.savings_usd == pytest.approx(plain.savings_usd - extra_usd)
    assert soft.keep_everything == plain.keep_everything  # deletes nothing: billed as before


def test_the_what_if_and_the_tier_settings_are_one_answer() -> None:
    """`billed_after_delete` over the tiers' settings: 7 d on a plain tier forecasts what a
    soft-delete tier does, and 0 s on a soft-delete tier what a plain one does."""
    spec, policy = example_spec(run_days=10, horizon_days=30), shipped_policy()
    configured = forecast(spec, policy, gcs_tiers(), flat_prices())
    asked = forecast(spec, policy, local_tiers(), flat_prices(), {"hot": SOFT_DELETE})
    plain = forecast(spec, policy, local_tiers(), flat_prices())
    switched_off = forecast(spec, policy, gcs_tiers(), flat_prices(), {"hot": timedelta(0)})

    assert asked == configured
    assert switched_off == plain
    assert configured.with_policy.deleted_billed_usd > 0


def test_versions_nothing_expires_stay_billed_to_the_horizon() -> None:
    """keep_versions without noncurrent_expiry: every byte ever removed from hot is still on
    the bill at the horizon."""
    spec, policy = example_spec(), shipped_policy()
    versions = ProviderSettings(versioned=True, keep_versions=True, source="tiers file")
    hot, *rest = local_tiers()
    tiers = [replace(hot, provider=versions), *rest]

    result = forecast(spec, policy, tiers, flat_prices())

    removed = sum(n for _t, n in removals_from_hot(spec, policy))
    last = result.with_policy.series[-1].usage
    assert last.deleted_billed_by_tier["hot"] == removed * TB == (357 + 40 + 5) * TB
    assert result.with_policy.deleted_billed_usd > 0


def test_n_runs_are_n_times_one_with_soft_delete() -> None:
    spec = example_spec(run_days=10, horizon_days=30)
    one = forecast(spec, shipped_policy(), gcs_tiers(), flat_prices())
    many = forecast(replace(spec, concurrent_runs=4), shipped_policy(), gcs_tiers(), flat_prices())

    for a, b in zip(one.with_policy.series, many.with_policy.series, strict=True):
        assert 4 * a.usage.deleted_billed_bytes == b.usage.deleted_billed_bytes
    assert many.with_policy.deleted_billed_usd == pytest.approx(
        4 * one.with_policy.deleted_billed_usd
    )


# --- any schedule --------------------------------------------------------------------------

INTERVALS = {
    "rolling": [timedelta(hours=h) for h in (1, 2, 3, 6, 8, 12)],
    "milestone": [timedelta(hours=12), timedelta(days=1), timedelta(days=2)],
}


@st.composite
def specs(draw: st.DrawFn) -> ForecastSpec:
    schedule: list[tuple[str, timedelta | None]] = [
        (klass, draw(st.sampled_from(every)))
        for klass, every in INTERVALS.items()
        if klass == "rolling" or draw(st.booleans())
    ]
    if draw(st.booleans()):
        schedule.append(("final", None))
    return ForecastSpec(
        checkpoint_bytes=draw(st.integers(1, 10**12)),
        run_days=draw(st.integers(1, 6)),
        schedule=tuple(schedule),
        concurrent_runs=draw(st.integers(1, 3)),
        horizon_days=draw(st.integers(1, 14)),
    )


def daily(result: Forecast, tier: str) -> list[int]:
    return [p.usage.deleted_billed_by_tier[tier] for p in result.with_policy.series]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    name=st.sampled_from(sorted(POLICIES)),
    windows=st.dictionaries(
        st.sampled_from(TIER_NAMES), st.integers(0, 20).map(lambda d: d * DAY), min_size=1
    ),
)
def test_billing_deleted_bytes_changes_the_bill_only(
    spec: ForecastSpec, name: str, windows: dict[str, timedelta]
) -> None:
    """For any schedule, policy and whole-day windows per tier: with no window the forecast
    is the plain one exactly; the policy stores the same bytes whatever the windows; what
    is billed after a delete on day d is what was removed in the window's days before
    (read off a run where nothing is ever let go of); every dollar of it is in the bill."""
    policy, tiers, prices = POLICIES[name], local_tiers(), flat_prices()
    plain = forecast(spec, policy, tiers, prices)
    zero = forecast(spec, policy, tiers, prices, dict.fromkeys(TIER_NAMES, timedelta(0)))
    kept = forecast(spec, policy, tiers, prices, windows)
    forever = forecast(spec, policy, tiers, prices, dict.fromkeys(windows, None))

    assert zero == plain
    for k, p in zip(kept.with_policy.series, plain.with_policy.series, strict=True):
        assert k.usage.bytes_by_tier == p.usage.bytes_by_tier
        everything = k.usage.bytes + k.usage.deleted_billed_bytes
        assert k.usage.usd_month == pytest.approx(everything / 1e9 * 0.023, rel=1e-9)
    assert kept.keep_everything == plain.keep_everything
    for tier, window in windows.items():
        removed = daily(forever, tier)  # removed from the tier by the end of each day
        days = window // DAY
        # index i is day i + 1: billed then is what went in days (i + 1 - window, i + 1]
        expected = [r - (removed[i - days] if i >= days else 0) for i, r in enumerate(removed)]
        assert daily(kept, tier) == expected
        assert all(a <= b for a, b in pairwise(removed))
    extra = kept.with_policy.storage_usd - plain.with_policy.storage_usd
    assert extra == pytest.approx(kept.with_policy.deleted_billed_usd, rel=1e-9, abs=1e-9)
    assert 0 <= kept.with_policy.deleted_billed_usd <= forever.with_policy.deleted_billed_usd
    assert kept.with_policy.fees_usd == pytest.approx(plain.with_policy.fees_usd)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), name=st.sampled_from(sorted(POLICIES)))
def test_kept_for_ever_the_hot_tier_bills_every_byte_written(spec: ForecastSpec, name: str) -> None:
    """Every checkpoint is written on the hottest tier and nothing moves onto it: when it
    forgets nothing, what it bills on day d is what was written by then."""
    result = forecast(spec, POLICIES[name], local_tiers(), flat_prices(), {"hot": None})

    each = spec.checkpoint_bytes * spec.concurrent_runs
    times = [t for t, _klass in planned_writes(spec)]
    for point in result.with_policy.series:
        usage = point.usage
        written = sum(1 for t in times if t <= point.day * DAY)
        assert usage.bytes_by_tier["hot"] + usage.deleted_billed_by_tier["hot"] == written * each
