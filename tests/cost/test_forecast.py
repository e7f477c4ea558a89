"""Forecasts (section 7b) against figures worked by hand from section 1: 1 TB checkpoints,
a 45-day run, 3 rolling (every 3 h) + a milestone a day + a final, $23 per TB-month.

Under the shipped default policy the run ends holding 3 + 45 + 1 = 49 TB ($1,127/month);
keeping everything it holds 360 + 45 + 1 = 406 TB ($9,338/month). Twenty runs: 980 TB and
$22,540/month ("about $22,500")."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest

from app.cost import replay as replay_module
from app.cost.forecast import (
    DAY,
    START,
    ForecastSpec,
    Usage,
    forecast,
    planned_writes,
)
from app.cost.prices import PriceQuote, effective_price
from app.domain.errors import Invalid
from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.policy.engine import evaluate
from app.policy.schema import Policy
from tests.cost.helpers import (
    TB,
    TIER_NAMES,
    example_spec,
    flat_prices,
    local_tiers,
    policy,
    shipped_policy,
    tier,
)

TIERS = local_tiers()


def tb(usage: Usage) -> dict[str, float]:
    return {name: size / TB for name, size in usage.bytes_by_tier.items() if size}


# --- the worked example ------------------------------------------------------------------------


def test_the_worked_example_ends_at_49_tb_and_1127_a_month() -> None:
    result = forecast(example_spec(), shipped_policy(), TIERS, flat_prices())

    end = result.with_policy.at_run_end
    assert end.bytes == 49 * TB  # 3 rolling + 45 milestones + 1 final
    assert tb(end) == {"hot": 49.0}
    assert end.usd_month == pytest.approx(1127.0)
    assert result.written == {"rolling": 360, "milestone": 45, "final": 1}


def test_twenty_runs_end_at_980_tb_and_about_22500_a_month() -> None:
    result = forecast(example_spec(concurrent_runs=20), shipped_policy(), TIERS, flat_prices())

    end = result.with_policy.at_run_end
    assert end.bytes == 980 * TB
    assert end.usd_month == pytest.approx(22_540.0)
    assert round(end.usd_month, -2) == 22_500


def test_keeping_everything_ends_at_406_tb() -> None:
    result = forecast(example_spec(), shipped_policy(), TIERS, flat_prices())

    end = result.keep_everything.at_run_end
    assert tb(end) == {"hot": 406.0}  # 360 rolling + 45 milestones + 1 final
    assert end.usd_month == pytest.approx(406 * 23)


def test_the_series_day_by_day() -> None:
    """Each day as it ends. Day 1: 8 rolling written, 3 kept, 1 milestone. Day 45: the final
    is copied to archive once the run has ended. Day 52 (run_ended 7d): milestones thinned
    to the best 5 (the latest, as metrics improve). Day 75 (30d): those move to cold."""
    series = forecast(example_spec(), shipped_policy(), TIERS, flat_prices()).with_policy.series

    by_day = {point.day: tb(point.usage) for point in series}
    assert [point.day for point in series] == list(range(1, 76))  # run + 30 days
    assert by_day[1] == {"hot": 4.0}
    assert by_day[44] == {"hot": 3.0 + 44}
    assert by_day[45] == {"hot": 49.0, "archive": 1.0}
    assert by_day[51] == {"hot": 49.0, "archive": 1.0}
    assert by_day[52] == {"hot": 3.0 + 5 + 1, "archive": 1.0}
    assert by_day[74] == {"hot": 9.0, "archive": 1.0}
    assert by_day[75] == {"hot": 3.0 + 1, "cold": 5.0, "archive": 1.0}
    assert series[51].usage.usd_month == pytest.approx(10 * 23)


def test_totals_over_the_horizon_by_hand() -> None:
    """Storage in TB-days x $23 / 30, integrated exactly over the 75 days.

    Policy: rolling 1 TB for 3 h, 2 TB for 3 h, then 3 TB to day 75 (224.25 TB-days);
    milestone k from day k to day 52 (sum of 52 - k = 1,305), then 5 to day 75 (115);
    the final on hot and on archive from day 45 (60): 1,704.25 TB-days.
    Keep everything: rolling k from k x 3 h (18,877.5), milestones (2,340), final (30)."""
    result = forecast(example_spec(), shipped_policy(), TIERS, flat_prices())

    policy_tb_days = (3 * 1 + 3 * 2) / 24 + 3 * (75 - 9 / 24) + 1305 + 5 * 23 + 2 * 30
    keep_tb_days = sum(75 - k / 8 for k in range(1, 361)) + sum(75 - k for k in range(1, 46)) + 30
    assert policy_tb_days == 1704.25 and keep_tb_days == 21247.5
    assert result.with_policy.total_usd == pytest.approx(1704.25 * 23 / 30)  # $1,306.59
    assert result.keep_everything.total_usd == pytest.approx(21247.5 * 23 / 30)  # $16,289.75
    assert result.savings_usd == pytest.approx((21247.5 - 1704.25) * 23 / 30)
    assert result.with_policy.fees_usd == 0.0  # no minimum durations, no retrieval fees


def test_n_runs_are_n_times_one() -> None:
    one = forecast(example_spec(), shipped_policy(), TIERS, flat_prices())
    many = forecast(example_spec(concurrent_runs=7), shipped_policy(), TIERS, flat_prices())

    for a, b in zip(one.with_policy.series, many.with_policy.series, strict=True):
        assert {k: 7 * v for k, v in a.usage.bytes_by_tier.items()} == b.usage.bytes_by_tier
    assert many.with_policy.total_usd == pytest.approx(7 * one.with_policy.total_usd)
    assert many.savings_usd == pytest.approx(7 * one.savings_usd)


def test_checkpoint_size_from_parameters() -> None:
    """A 70B model at 14 bytes per parameter: 0.98 TB checkpoints, 48.02 TB at run end."""
    result = forecast(
        example_spec(checkpoint_bytes=70 * 10**9 * 14), shipped_policy(), TIERS, flat_prices()
    )
    assert result.with_policy.at_run_end.bytes == 49 * 980 * 10**9


def test_without_metrics_keep_best_keeps_every_milestone() -> None:
    result = forecast(example_spec(metrics="missing"), shipped_policy(), TIERS, flat_prices())

    by_day = {p.day: tb(p.usage) for p in result.with_policy.series}
    assert by_day[52] == {"hot": 49.0, "archive": 1.0}
    assert by_day[75] == {"hot": 4.0, "cold": 45.0, "archive": 1.0}
    assert any("no metrics" in note for note in result.assumptions)


def test_a_horizon_shorter_than_the_run_still_reports_the_run_end() -> None:
    result = forecast(example_spec(horizon_days=10), shipped_policy(), TIERS, flat_prices())

    assert [p.day for p in result.with_policy.series] == list(range(1, 11))
    assert result.with_policy.at_run_end.bytes == 49 * TB


# --- prices, fees and early deletion ----------------------------------------------------------


def test_real_prices_put_each_tier_at_its_own_rate() -> None:
    """Hot on S3 Standard, cold on Glacier Instant Retrieval: on day 75 the 5 milestones sit
    on cold at $0.004 (having served nothing of the 90 days: no charge yet)."""
    prices = flat_prices(0.023)
    prices["cold"] = effective_price(tier(storage_class="GLACIER_IR"))
    prices["archive"] = effective_price(tier(storage_class="DEEP_ARCHIVE"))

    result = forecast(example_spec(), shipped_policy(), TIERS, prices)

    day75 = result.with_policy.series[-1].usage
    assert day75.usd_month == pytest.approx(4000 * 0.023 + 5000 * 0.004 + 1000 * 0.00099)
    assert result.with_policy.fees_usd == pytest.approx(0.0, abs=0.01)  # requests only


def test_a_demotion_that_would_be_deleted_early_is_skipped_in_the_replay() -> None:
    """Milestones cooled a day after the run and purged 10 days after it: 9 days on Glacier
    IR costs 81 unserved days (M p_T = 0.36 > L p_S = 0.207), so they stay on hot."""
    prices = flat_prices(0.023)
    prices["cold"] = effective_price(tier(storage_class="GLACIER_IR"))
    rules = policy(
        {
            "name": "short",
            "rules": [
                {"name": "roll", "class": "rolling", "keep_last": 3, "action": "delete"},
                {
                    "name": "cool",
                    "class": "milestone",
                    "when": {"run_ended": "1d"},
                    "action": {"move_to": "cold"},
                },
                {
                    "name": "purge",
                    "class": "milestone",
                    "when": {"run_ended": "10d"},
                    "action": "delete",
                },
            ],
        }
    )

    result = forecast(example_spec(), rules, TIERS, prices)

    assert result.skipped_demotions == 45
    assert all("cold" not in tb(p.usage) for p in result.with_policy.series)
    assert result.with_policy.fees_usd == pytest.approx(0.0, abs=0.01)


def test_fees_of_a_move_across_providers() -> None:
    """Finals moved at run end from S3 Standard to Backblaze B2: $0.09/GB of egress."""
    prices = flat_prices(0.023)
    prices["hot"] = effective_price(tier(storage_class="STANDARD"))
    prices["archive"] = effective_price(tier(endpoint_url="https://s3.backblazeb2.com"))
    rules = policy(
        {
            "name": "ship",
            "rules": [
                {"name": "roll", "class": "rolling", "keep_last": 3, "action": "delete"},
                {
                    "name": "ship",
                    "class": "final",
                    "when": {"run_ended": "0s"},
                    "action": {"move_to": "archive"},
                },
            ],
        }
    )

    result = forecast(example_spec(), rules, TIERS, prices)

    requests = (0.0004 + 0.0) / 1000
    assert result.with_policy.fees_usd == pytest.approx(1000 * 0.09 + requests)
    assert result.with_policy.total_usd == pytest.approx(
        result.with_policy.storage_usd + result.with_policy.fees_usd
    )


def test_deleting_before_a_minimum_duration_is_charged() -> None:
    """Rolling checkpoints on Wasabi (90 days minimum) deleted after 9 h each: every delete
    pays the unserved days; 357 deletes in the run."""
    prices = flat_prices(0.023)
    prices["hot"] = effective_price(tier(endpoint_url="https://s3.wasabisys.com"))
    spec = example_spec(schedule=(("rolling", timedelta(hours=3)),), horizon_days=45)

    result = forecast(spec, shipped_policy(), TIERS, prices)

    each = 1000 * 0.0068262 * (90 - 9 / 24) / 30
    assert result.with_policy.fees_usd == pytest.approx(357 * each)


# --- the schedule and its limits ---------------------------------------------------------------


def test_writes_follow_the_schedule() -> None:
    spec = example_spec(run_days=2, schedule=(("rolling", timedelta(hours=12)), ("final", None)))
    assert planned_writes(spec) == [
        (timedelta(hours=12), "rolling"),
        (timedelta(hours=24), "rolling"),
        (timedelta(hours=36), "rolling"),
        (timedelta(hours=48), "rolling"),
        (timedelta(hours=48), "final"),  # equal times: in schedule order
    ]
    assert planned_writes(example_spec(run_days=1, schedule=(("x", timedelta(days=2)),))) == []


def test_too_many_writes_are_refused() -> None:
    spec = example_spec(run_days=365, schedule=(("rolling", timedelta(minutes=5)),))
    with pytest.raises(Invalid) as error:
        planned_writes(spec)
    assert error.value.field == "schedule"


def test_a_replay_too_large_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "MAX_WORK", 1000)
    keep_all = policy(
        {"name": "slow", "rules": [{"name": "never", "when": {"age": "999d"}, "action": "delete"}]}
    )
    with pytest.raises(Invalid, match="too many checkpoints") as error:
        forecast(example_spec(), keep_all, TIERS, flat_prices())
    assert error.value.field == "schedule"


def test_every_tier_needs_a_price() -> None:
    with pytest.raises(Invalid) as error:
        forecast(example_spec(), shipped_policy(), TIERS, {"hot": PriceQuote()})
    assert error.value.field == "prices"


# --- the shortcuts change nothing --------------------------------------------------------------


def naive_replay(spec: ForecastSpec, rules: Policy) -> list[dict[str, int]]:
    """Bytes per tier at each day's end: the engine over every live checkpoint after every
    registration, at the run's end and at every day boundary, no shortcut taken."""
    ranks = {name: rank for rank, name in enumerate(TIER_NAMES)}
    run = RunSnapshot(id="run-1", project="forecast", name="run-1", status="active")
    live: dict[str, CheckpointSnapshot] = {}
    modes = {r.keep_best.metric: r.keep_best.mode for r in rules.rules if r.keep_best}

    def act(now: Any) -> None:
        for a in evaluate(rules, run, list(live.values()), now, tier_ranks=ranks).actions:
            c = live[a.checkpoint_id]
            if a.kind == "delete":
                del live[c.id]
            elif a.kind == "move":
                assert a.to_tier is not None
                held = (c.tiers - {c.tier}) | {a.to_tier}
                live[c.id] = c._replace(tier=a.to_tier, tiers=frozenset(held))
            else:
                assert a.to_tier is not None
                live[c.id] = c._replace(tiers=c.tiers | {a.to_tier})

    at: dict[Any, list[str]] = {}
    for t, klass in planned_writes(spec):
        at.setdefault(START + t, []).append(klass)
    days = {START + d * DAY for d in range(1, spec.horizon + 1)}
    out = []
    step = 0
    for now in sorted(at.keys() | days):
        for klass in at.get(now, ()):
            step += 1
            score = {m: float(-step if mode == "min" else step) for m, mode in modes.items()}
            live[f"c{step}"] = CheckpointSnapshot(
                f"c{step}",
                run.id,
                step,
                klass,
                "active",
                spec.checkpoint_bytes,
                now,
                "hot",
                frozenset({"hot"}),
                MappingProxyType(score),
            )
            act(now)
        if now == START + spec.run_days * DAY:
            run = RunSnapshot(run.id, run.project, run.name, "completed", ended_at=now)
            act(now)
        if now in days:
            act(now)
            stored = dict.fromkeys(TIER_NAMES, 0)
            for c in live.values():
                for name in c.tiers:
                    stored[name] += c.size_bytes
            out.append(stored)
    return out


POLICIES = {
    "shipped": shipped_policy(),
    "calendar": policy(
        {
            "name": "calendar",
            "rules": [
                {
                    "name": "roll",
                    "class": "rolling",
                    "keep_last": 2,
                    "keep_daily": 3,
                    "action": "delete",
                },
                {
                    "name": "age",
                    "class": "milestone",
                    "when": {"age": "10d"},
                    "keep_weekly": 2,
                    "action": "delete",
                },
                {"name": "cool", "when": {"run_ended": "3d"}, "action": {"move_to": "warm"}},
            ],
        }
    ),
    "within": policy(
        {
            "name": "within",
            "rules": [
                {
                    "name": "recent",
                    "class": ["rolling", "milestone"],
                    "keep_within": "2d",
                    "keep_every": {"steps": 10},
                    "action": "delete",
                },
                {"name": "copy", "class": "final", "action": {"copy_to": "archive"}},
            ],
        }
    ),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_replay_matches_the_engine_at_every_moment(name: str) -> None:
    spec = example_spec(run_days=12, horizon_days=30)
    rules = POLICIES[name]

    result = forecast(spec, rules, TIERS, flat_prices())

    assert [dict(p.usage.bytes_by_tier) for p in result.with_policy.series] == naive_replay(
        spec, rules
    )
