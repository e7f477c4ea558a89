"""What a forecast is asked and what it answers (section 7b): the simulated runs' spec,
usage per tier on each day, a scenario's series, and the limits that keep one call short.
Pure data, shared by the replay (replay.py) and the forecast itself (forecast.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Literal

from app.cost.prices import MONTH_DAYS

Metrics = Literal["improving", "missing"]

# A Monday at midnight UTC: simulated days are calendar days, weeks are ISO weeks.
START = datetime(2025, 1, 6, tzinfo=UTC)
DAY = timedelta(days=1)
MONTH_SECONDS = MONTH_DAYS * 86_400
MAX_DAYS = 3650
MAX_WRITES = 10_000  # checkpoints one simulated run may write
MAX_WORK = 2_000_000  # checkpoints handed to the engine in one replay: an API call stays short


ASSUMPTIONS = (
    "every checkpoint is written on the hottest tier",
    "concurrent runs start together and follow one schedule",
    "checkpoints of one run take increasing steps in the order they are written",
    "the policy is evaluated after every registration, when the run ends and at each day "
    "boundary; its actions complete at once",
    "held deletes count as approved and deleted bytes are freed at once, except on a tier "
    "whose provider keeps billing deleted bytes (soft delete, noncurrent versions): there "
    "they stay billed that long after the delete (to the horizon when for ever)",
    "a month of storage is 30 days; 1 GB is 10^9 bytes",
)


IMPROVING = "metrics named by keep_best improve with every checkpoint, so the best are the latest"


MISSING = "checkpoints carry no metrics, so keep_best keeps them all"


@dataclass(frozen=True, slots=True)
class ForecastSpec:
    """What to simulate. `schedule` is (class, interval) in write order at equal times; an
    interval of None writes one checkpoint when the run ends."""

    checkpoint_bytes: int
    run_days: int
    schedule: tuple[tuple[str, timedelta | None], ...]
    concurrent_runs: int = 1
    horizon_days: int | None = None  # default: the run and 30 days
    metrics: Metrics = "improving"

    @property
    def horizon(self) -> int:
        return self.horizon_days if self.horizon_days is not None else self.run_days + 30


@dataclass(frozen=True, slots=True)
class Usage:
    """What is stored at one moment, and what that costs a month: the live checkpoints'
    bytes, and apart from them the bytes deleted from a tier whose provider still bills
    them (`usd_month` prices both)."""

    bytes_by_tier: Mapping[str, int]
    usd_month: float
    deleted_billed_by_tier: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_tier.values())

    @property
    def deleted_billed_bytes(self) -> int:
        return sum(self.deleted_billed_by_tier.values())


@dataclass(frozen=True, slots=True)
class DayUsage:
    day: int
    usage: Usage


@dataclass(frozen=True, slots=True)
class Scenario:
    series: tuple[DayUsage, ...]  # days 1 .. horizon, each at its end
    at_run_end: Usage  # just after the checkpoints written when the run ends
    storage_usd: float  # storage over the horizon
    fees_usd: float = 0.0  # retrieval, egress and early deletion within the horizon
    deleted_billed_usd: float = 0.0  # the part of storage_usd billed for deleted bytes

    @property
    def total_usd(self) -> float:
        return self.storage_usd + self.fees_usd


@dataclass(frozen=True, slots=True)
class Forecast:
    policy: str
    spec: ForecastSpec
    written: Mapping[str, int]  # checkpoints each run writes, per class
    with_policy: Scenario
    keep_everything: Scenario
    skipped_demotions: int = 0  # checkpoints (per run) kept off a tier for early deletion
    assumptions: tuple[str, ...] = field(default=())

    @property
    def savings_usd(self) -> float:
        return self.keep_everything.total_usd - self.with_policy.total_usd
