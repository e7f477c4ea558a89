"""Calendar thinning (keep_hourly/daily/weekly/monthly/yearly) with the semantics of restic's
`forget`: newest to oldest by created_at (UTC; ties: higher step first), each clause keeps a
checkpoint whose period differs from that of the last one it kept until it has kept N, and
the oldest checkpoint is kept too while the clause still has count left."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from app.domain.plan import CheckpointSnapshot
from tests.unit.engine_builders import (
    deleted_ids,
    kept_reasons,
    make_checkpoint,
    make_policy,
    make_run,
    plan_for,
    rule,
)

LATER = datetime(2030, 1, 1, tzinfo=UTC)  # evaluation time: after every checkpoint below
RUN = make_run(status="completed", ended_at=LATER - timedelta(days=1))


def at(text: str) -> datetime:
    """A UTC instant from 'YYYY-MM-DD HH:MM' (or an ISO string with its own offset)."""
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def series(*times: str, klass: str = "rolling") -> list[CheckpointSnapshot]:
    """One checkpoint per time, id = the time text, steps rising with time (100, 200, ...)."""
    ordered = sorted(times, key=at)
    return [
        make_checkpoint(100 * (i + 1), klass=klass, created_at=at(t), checkpoint_id=t)
        for i, t in enumerate(ordered)
    ]


def kept_ids(checkpoints: Sequence[CheckpointSnapshot], **clauses: Any) -> set[str]:
    """Ids a single delete rule with `clauses` keeps, through the full engine."""
    plan = plan_for(make_policy(rules=[rule("thin", **clauses)]), RUN, checkpoints, now=LATER)
    return {c.id for c in checkpoints} - deleted_ids(plan)


# several checkpoints a day over four days
DAYS = series(
    "2026-06-10 08:00",
    "2026-06-10 20:00",
    "2026-06-11 09:00",
    "2026-06-11 10:00",
    "2026-06-11 23:59",
    "2026-06-12 00:00",
    "2026-06-12 12:00",
    "2026-06-13 06:00",
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, {"2026-06-13 06:00"}),
        (3, {"2026-06-13 06:00", "2026-06-12 12:00", "2026-06-11 23:59"}),
        # exactly as many days as the count: the count is spent before the oldest
        (4, {"2026-06-13 06:00", "2026-06-12 12:00", "2026-06-11 23:59", "2026-06-10 20:00"}),
        # more count than days: the oldest is kept additionally
        (
            5,
            {
                "2026-06-13 06:00",
                "2026-06-12 12:00",
                "2026-06-11 23:59",
                "2026-06-10 20:00",
                "2026-06-10 08:00",
            },
        ),
        # -1: one per day for every day, and the oldest (the count is never spent)
        (
            -1,
            {
                "2026-06-13 06:00",
                "2026-06-12 12:00",
                "2026-06-11 23:59",
                "2026-06-10 20:00",
                "2026-06-10 08:00",
            },
        ),
        (0, set()),
    ],
)
def test_keep_daily_keeps_the_newest_of_each_recent_day(count: int, expected: set[str]) -> None:
    assert kept_ids(DAYS, keep_daily=count) == expected


def test_keep_daily_periods_are_calendar_days_not_24h_windows() -> None:
    checkpoints = series("2026-06-11 23:59", "2026-06-12 00:01", "2026-06-12 23:00")
    assert kept_ids(checkpoints, keep_daily=2) == {"2026-06-12 23:00", "2026-06-11 23:59"}


def test_keep_daily_skips_days_without_checkpoints() -> None:
    checkpoints = series("2026-06-01 10:00", "2026-06-05 10:00", "2026-06-20 10:00")
    assert kept_ids(checkpoints, keep_daily=2) == {"2026-06-20 10:00", "2026-06-05 10:00"}


HOURS = series(
    "2026-06-11 10:00",
    "2026-06-12 09:59",
    "2026-06-12 10:00",
    "2026-06-12 10:05",
    "2026-06-12 10:55",
    "2026-06-12 11:00",
    "2026-06-12 11:30",
    "2026-06-12 12:15",
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (2, {"2026-06-12 12:15", "2026-06-12 11:30"}),
        (3, {"2026-06-12 12:15", "2026-06-12 11:30", "2026-06-12 10:55"}),
        # the same hour on another day is another period
        (
            5,
            {
                "2026-06-12 12:15",
                "2026-06-12 11:30",
                "2026-06-12 10:55",
                "2026-06-12 09:59",
                "2026-06-11 10:00",
            },
        ),
        # more count than hours: the oldest is the newest of its hour anyway
        (
            9,
            {
                "2026-06-12 12:15",
                "2026-06-12 11:30",
                "2026-06-12 10:55",
                "2026-06-12 09:59",
                "2026-06-11 10:00",
            },
        ),
    ],
)
def test_keep_hourly(count: int, expected: set[str]) -> None:
    assert kept_ids(HOURS, keep_hourly=count) == expected


# 2026-12-28 (Mon) .. 2027-01-03 (Sun) is ISO week 2026-W53; 2027-01-04 (Mon) starts 2027-W01
YEAR_END = series(
    "2026-12-20 12:00",  # Sun, 2026-W51
    "2026-12-21 12:00",  # Mon, 2026-W52
    "2026-12-28 12:00",  # Mon, 2026-W53
    "2026-12-31 12:00",  # Thu, 2026-W53
    "2027-01-01 12:00",  # Fri, 2026-W53
    "2027-01-03 23:59",  # Sun, 2026-W53
    "2027-01-04 00:00",  # Mon, 2027-W01
    "2027-01-05 12:00",  # Tue, 2027-W01
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, {"2027-01-05 12:00"}),
        (2, {"2027-01-05 12:00", "2027-01-03 23:59"}),
        (3, {"2027-01-05 12:00", "2027-01-03 23:59", "2026-12-21 12:00"}),
        (-1, {"2027-01-05 12:00", "2027-01-03 23:59", "2026-12-21 12:00", "2026-12-20 12:00"}),
    ],
)
def test_keep_weekly_uses_iso_weeks_across_the_year_boundary(
    count: int, expected: set[str]
) -> None:
    assert kept_ids(YEAR_END, keep_weekly=count) == expected


def test_keep_weekly_2026_12_31_and_2027_01_01_share_one_week() -> None:
    checkpoints = series("2026-12-31 12:00", "2027-01-01 12:00")
    assert kept_ids(checkpoints, keep_weekly=1) == {"2027-01-01 12:00"}


def test_keep_weekly_weeks_start_on_monday() -> None:
    checkpoints = series("2026-06-08 00:00", "2026-06-14 23:59", "2026-06-15 00:00")
    assert kept_ids(checkpoints, keep_weekly=2) == {"2026-06-15 00:00", "2026-06-14 23:59"}


def test_keep_yearly_uses_calendar_years_not_iso_years() -> None:
    assert kept_ids(YEAR_END, keep_yearly=2) == {"2027-01-05 12:00", "2026-12-31 12:00"}


MONTHS = series(
    "2025-11-30 12:00",
    "2026-01-31 23:59",
    "2026-02-01 00:00",
    "2026-02-28 12:00",
    "2026-03-01 10:00",
    "2026-03-15 10:00",
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, {"2026-03-15 10:00"}),
        (2, {"2026-03-15 10:00", "2026-02-28 12:00"}),
        (3, {"2026-03-15 10:00", "2026-02-28 12:00", "2026-01-31 23:59"}),
        (4, {"2026-03-15 10:00", "2026-02-28 12:00", "2026-01-31 23:59", "2025-11-30 12:00"}),
    ],
)
def test_keep_monthly(count: int, expected: set[str]) -> None:
    assert kept_ids(MONTHS, keep_monthly=count) == expected


YEARS = series(
    "2023-03-01 00:00",
    "2023-12-31 23:59",
    "2024-01-01 00:00",
    "2024-07-01 00:00",
    "2025-05-05 05:05",
    "2026-01-01 00:00",
    "2026-06-01 00:00",
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, {"2026-06-01 00:00"}),
        (3, {"2026-06-01 00:00", "2025-05-05 05:05", "2024-07-01 00:00"}),
        # -1: the newest of every year, plus the oldest checkpoint
        (
            -1,
            {
                "2026-06-01 00:00",
                "2025-05-05 05:05",
                "2024-07-01 00:00",
                "2023-12-31 23:59",
                "2023-03-01 00:00",
            },
        ),
    ],
)
def test_keep_yearly(count: int, expected: set[str]) -> None:
    assert kept_ids(YEARS, keep_yearly=count) == expected


def test_a_single_checkpoint_is_kept_by_any_nonzero_count() -> None:
    only = series("2026-06-12 10:00")
    for clause in ("keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly"):
        assert kept_ids(only, **{clause: 1}) == {"2026-06-12 10:00"}
        assert kept_ids(only, **{clause: -1}) == {"2026-06-12 10:00"}
        assert kept_ids(only, **{clause: 0}) == set()


# -- order: created_at, not step; ties by the higher step -------------------------------------


def test_order_is_by_created_at_not_by_step() -> None:
    checkpoints = [
        make_checkpoint(900, created_at=at("2026-06-10 10:00"), checkpoint_id="early-high"),
        make_checkpoint(100, created_at=at("2026-06-12 10:00"), checkpoint_id="late-low"),
        make_checkpoint(500, created_at=at("2026-06-11 10:00"), checkpoint_id="middle"),
    ]
    assert kept_ids(checkpoints, keep_daily=1) == {"late-low"}
    assert kept_ids(checkpoints, keep_daily=5) == {"late-low", "middle", "early-high"}


@pytest.mark.parametrize("reverse", [False, True], ids=["input ascending", "input descending"])
def test_ties_in_created_at_go_to_the_higher_step(reverse: bool) -> None:
    same = at("2026-06-12 10:00")
    checkpoints = [
        make_checkpoint(100, created_at=same),
        make_checkpoint(300, created_at=same),
        make_checkpoint(200, created_at=same),
    ]
    if reverse:
        checkpoints.reverse()
    assert kept_ids(checkpoints, keep_daily=1) == {"run-1-300"}
    # with count left, the oldest is the lowest step of the tie
    assert kept_ids(checkpoints, keep_daily=2) == {"run-1-300", "run-1-100"}


def test_tie_across_a_period_boundary_still_orders_by_time_first() -> None:
    checkpoints = [
        make_checkpoint(100, created_at=at("2026-06-12 10:00")),
        make_checkpoint(200, created_at=at("2026-06-12 10:00")),
        make_checkpoint(300, created_at=at("2026-06-11 10:00")),
    ]
    assert kept_ids(checkpoints, keep_daily=2) == {"run-1-200", "run-1-300"}


# -- several clauses: a union, each clause walking on its own -----------------------------------

# one checkpoint a day, Mon 2026-06-01 .. Sun 2026-06-14: ISO weeks W23 and W24
FORTNIGHT = series(*[f"2026-06-{d:02d} 12:00" for d in range(1, 15)])


@pytest.mark.parametrize(
    ("clauses", "expected_days"),
    [
        ({"keep_daily": 2, "keep_weekly": 2}, {14, 13, 7}),
        # weekly has count left at the oldest: the oldest is kept too
        ({"keep_daily": 2, "keep_weekly": 3}, {14, 13, 7, 1}),
        ({"keep_daily": 3, "keep_monthly": 1}, {14, 13, 12}),
        ({"keep_daily": 3, "keep_monthly": 2}, {14, 13, 12, 1}),
        ({"keep_daily": 1, "keep_weekly": 1, "keep_monthly": 1, "keep_yearly": 1}, {14}),
        ({"keep_daily": 0, "keep_weekly": 1}, {14}),
        ({"keep_daily": 7, "keep_weekly": -1}, {14, 13, 12, 11, 10, 9, 8, 7, 1}),
        ({"keep_last": 1, "keep_weekly": 2}, {14, 7}),
        ({"keep_every": {"steps": 500}, "keep_weekly": 1}, {14, 5, 10}),
        ({"keep_within": "3d", "keep_weekly": 2}, {14, 7}),
    ],
)
def test_calendar_clauses_combine_as_a_union(
    clauses: dict[str, Any], expected_days: set[int]
) -> None:
    assert kept_ids(FORTNIGHT, **clauses) == {f"2026-06-{d:02d} 12:00" for d in expected_days}


def test_hourly_and_daily_over_three_days_of_hourly_checkpoints() -> None:
    start = at("2026-06-10 00:30")
    times = [(start + timedelta(hours=h)).strftime("%Y-%m-%d %H:%M") for h in range(72)]
    checkpoints = series(*times)
    kept = kept_ids(checkpoints, keep_hourly=6, keep_daily=7)
    last_six = set(times[-6:])
    newest_of_each_day = {"2026-06-12 23:30", "2026-06-11 23:30", "2026-06-10 23:30"}
    oldest = {"2026-06-10 00:30"}  # keep_daily still has count left there
    assert kept == last_six | newest_of_each_day | oldest


def test_calendar_reasons_name_every_clause_that_kept() -> None:
    policy = make_policy(rules=[rule("thin", keep_daily=2, keep_weekly=2)])
    plan = plan_for(policy, RUN, FORTNIGHT, now=LATER)
    assert kept_reasons(plan, "2026-06-14 12:00") == ("thin: keep_daily 2, keep_weekly 2",)
    assert kept_reasons(plan, "2026-06-13 12:00") == ("thin: keep_daily 2",)
    assert kept_reasons(plan, "2026-06-07 12:00") == ("thin: keep_weekly 2",)
    delete = next(a for a in plan.actions if a.checkpoint_id == "2026-06-06 12:00")
    assert delete.reason == "thin: delete, not kept by keep_daily 2 or keep_weekly 2"


# -- scope: the rule's class, the run's active checkpoints -------------------------------------


def test_calendar_counts_only_the_rule_class_and_active_checkpoints() -> None:
    checkpoints = [
        *series("2026-06-10 12:00", "2026-06-11 12:00"),
        make_checkpoint(
            900, klass="milestone", created_at=at("2026-06-12 12:00"), checkpoint_id="other-class"
        ),
        make_checkpoint(
            950, state="writing", created_at=at("2026-06-13 12:00"), checkpoint_id="writing"
        ),
        make_checkpoint(
            990,
            run_id="run-2",
            created_at=at("2026-06-14 12:00"),
            checkpoint_id="other-run",
        ),
    ]
    policy = make_policy(rules=[rule("thin", klass="rolling", keep_daily=1)])
    plan = plan_for(policy, RUN, checkpoints, now=LATER)
    assert deleted_ids(plan) == {"2026-06-10 12:00"}


def test_calendar_ranks_whether_or_not_when_holds() -> None:
    checkpoints = [
        make_checkpoint(100, created_at=at("2026-06-10 12:00"), tier="warm", checkpoint_id="a"),
        make_checkpoint(200, created_at=at("2026-06-11 12:00"), tier="warm", checkpoint_id="b"),
        make_checkpoint(300, created_at=at("2026-06-12 12:00"), tier="hot", checkpoint_id="c"),
    ]
    policy = make_policy(rules=[rule("thin", keep_daily=2, when={"on_tier": ["warm"]})])
    plan = plan_for(policy, RUN, checkpoints, now=LATER)
    assert deleted_ids(plan) == {"a"}


# -- periods are UTC -------------------------------------------------------------------------------


def test_periods_are_taken_in_utc_whatever_the_offset_of_created_at() -> None:
    plus_two = timezone(timedelta(hours=2))
    checkpoints = [
        # 2026-06-12 01:00 at +02:00 is 2026-06-11 23:00 UTC: the same UTC day as "b"
        make_checkpoint(
            200, created_at=datetime(2026, 6, 12, 1, 0, tzinfo=plus_two), checkpoint_id="a"
        ),
        make_checkpoint(100, created_at=at("2026-06-11 22:00"), checkpoint_id="b"),
        make_checkpoint(50, created_at=at("2026-06-10 22:00"), checkpoint_id="c"),
    ]
    assert kept_ids(checkpoints, keep_daily=2) == {"a", "c"}
