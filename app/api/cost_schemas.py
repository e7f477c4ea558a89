"""Bodies of the cost endpoints: reports, forecasts, the planner. Requests refuse unknown
fields; sizes may be written as JSON numbers like 1e12 but must be whole."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from app.api.schemas import (
    NAME_PATTERN,
    Name,
    PriceRead,
    TierRead,
    not_both,
    only_with,
    present,
)
from app.cost.forecast import MAX_DAYS, Forecast, ForecastSpec, Scenario, Usage
from app.cost.planner import (
    BYTES_PER_PARAMETER,
    DEFAULT_BYTES_PER_PARAMETER,
    Sizing,
    SizingInputs,
)
from app.cost.prices import PriceQuote
from app.domain.duration import parse_duration
from app.domain.errors import Invalid
from app.services.cost.report import CostReport, GroupBy

MAX_BYTES = 10**18


def _whole(value: object) -> object:
    """A whole JSON number: 1e12 is 10^12; 1.5, "7" and true are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a whole number")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


def _duration(value: str) -> str:
    if parse_duration(value) <= timedelta(0):
        raise ValueError("must be longer than 0s")
    return value


def _interval(value: str) -> str:
    return value if value == "end" else _duration(value)


def _policy_ref(value: object) -> object:
    """A policy's name or a policy object: anything else is refused here, once, under
    `policy` (not once per member of the union)."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        if re.fullmatch(NAME_PATTERN, value):
            return value
        raise ValueError(f"{value[:80]!r} is not a policy name (pattern {NAME_PATTERN})")
    raise ValueError("must be a policy's name or a policy object")


Whole = Annotated[int, Field(ge=1, le=MAX_BYTES), BeforeValidator(_whole)]
Positive = Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False, strict=True)]
# Bounded so that their product is a checkpoint of at most MAX_BYTES, as the document says:
# 10^16 parameters (10,000 times the largest models) at 1 to 100 bytes each (a checkpoint
# of at least one byte).
Parameters = Annotated[int, Field(ge=1, le=10**16), BeforeValidator(_whole)]
PerParameter = Annotated[float, Field(ge=1, le=100, allow_inf_nan=False, strict=True)]
Money = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)]
Days = Annotated[int, Field(ge=1, le=MAX_DAYS), BeforeValidator(_whole)]
# What parse_duration reads and _duration keeps, said in the document (a longer one is
# refused as too long, a zero one as empty).
DURATION_PATTERN = r"^[1-9][0-9]{0,5}[smhdw]$"
DurationText = Annotated[
    str,
    Field(max_length=32, pattern=DURATION_PATTERN, examples=["1h", "24h"]),
    AfterValidator(_duration),
]
Interval = Annotated[
    str,
    Field(max_length=32, pattern=r"^(end|[1-9][0-9]{0,5}[smhdw])$", examples=["3h", "1d", "end"]),
    AfterValidator(_interval),
]
# A tier's name, or `*` for every tier (app.services.cost.inputs.tier_prices says how they layer).
PricedTier = Annotated[str, Field(pattern=rf"^(\*|{NAME_PATTERN[1:-1]})$", examples=["*", "cold"])]
Recipe = Literal["fp32-master-adam", "bf16-fp32-master-adam", "zero-mixed-adam"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- prices --------------------------------------------------------------------------------


class SourceRead(BaseModel):
    url: str
    covers: str
    as_of: str


class PriceQuoteRead(PriceRead):
    """A tier's effective price: the four figures of the tiers file's `price`, then the
    rest of the catalog's, and where each came from."""

    min_object_bytes: int
    write_requests_per_1000: float
    read_requests_per_1000: float
    provider: str
    catalog: str | None = Field(description="the built-in entry the defaults came from")
    given: list[str] = Field(description="figures set on the tier itself (or by a what-if)")
    sources: dict[str, SourceRead] = Field(description="figure -> its published source")
    note: str | None


def price_read(quote: PriceQuote) -> PriceQuoteRead:
    return PriceQuoteRead(
        storage_gb_month=quote.storage_gb_month,
        retrieval_gb=quote.retrieval_gb,
        egress_gb=quote.egress_gb,
        min_storage_days=quote.min_storage_days,
        min_object_bytes=quote.min_object_bytes,
        write_requests_per_1000=quote.write_requests_per_1000,
        read_requests_per_1000=quote.read_requests_per_1000,
        provider=quote.provider,
        catalog=quote.catalog,
        given=sorted(quote.given),
        sources={
            k: SourceRead(url=s.url, covers=s.covers, as_of=s.as_of)
            for k, s in quote.sources.items()
        },
        note=quote.note,
    )


class TierPricedRead(TierRead):
    """A tier with its usage and its effective price (catalog defaults, its own figures
    over them)."""

    price: PriceQuoteRead


class PriceOverride(Strict):
    """A what-if price for one tier: a catalog entry's defaults, and/or single figures."""

    catalog: Annotated[str, Field(max_length=80, examples=["aws/GLACIER_IR"])] | None = None
    storage_gb_month: Money | None = None
    retrieval_gb: Money | None = None
    egress_gb: Money | None = None
    min_storage_days: Annotated[int, Field(ge=0, le=36_500), BeforeValidator(_whole)] | None = None
    min_object_bytes: Annotated[int, Field(ge=0, le=MAX_BYTES), BeforeValidator(_whole)] | None = (
        None
    )
    write_requests_per_1000: Money | None = None
    read_requests_per_1000: Money | None = None


# --- reports -------------------------------------------------------------------------------


class CostRowRead(BaseModel):
    key: str
    name: str | None = Field(None, description="a run's <project>/<run name>")
    bytes: int = Field(description="stored over every location, replicas included")
    checkpoints: int
    trashed_bytes: int = Field(description="part of bytes held by trashed checkpoints")
    usd_month: float


class CostReportRead(BaseModel):
    group_by: GroupBy
    rows: list[CostRowRead]
    total_bytes: int
    total_usd_month: float
    prices: dict[str, PriceQuoteRead]


def report_read(report: CostReport) -> CostReportRead:
    return CostReportRead(
        group_by=report.group_by,
        rows=[
            CostRowRead(
                key=r.key,
                name=r.name,
                bytes=r.bytes,
                checkpoints=r.checkpoints,
                trashed_bytes=r.trashed_bytes,
                usd_month=r.usd_month,
            )
            for r in report.rows
        ],
        total_bytes=report.total_bytes,
        total_usd_month=report.total_usd_month,
        prices={tier: price_read(q) for tier, q in report.prices.items()},
    )


# --- forecasts -----------------------------------------------------------------------------


class ForecastRequest(Strict):
    """checkpoint_bytes or parameters (one of them); bytes_per_parameter with parameters."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {"anyOf": [present("checkpoint_bytes"), present("parameters")]},
                not_both("checkpoint_bytes", "parameters"),
                only_with("bytes_per_parameter", "parameters"),
            ]
        },
    )

    checkpoint_bytes: Whole | None = Field(None, examples=[1e12])
    parameters: Parameters | None = Field(None, examples=[70e9])
    bytes_per_parameter: PerParameter | None = Field(
        None, description="with parameters; default 14 (bf16 weights, fp32 master, Adam m, v)"
    )
    run_days: Days
    schedule: Annotated[dict[Name, Interval], Field(min_length=1, max_length=16)] = Field(
        description="class -> interval, or `end` for one checkpoint when the run ends",
        examples=[{"rolling": "3h", "milestone": "1d", "final": "end"}],
    )
    policy: Annotated[Name | dict[str, Any] | None, BeforeValidator(_policy_ref)] = Field(
        None, description="a stored policy's name (default: `default`) or a policy inline"
    )
    concurrent_runs: Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_whole)] = 1
    horizon_days: Days | None = Field(None, description="default: run_days + 30")
    metrics: Literal["improving", "missing"] = Field(
        "improving", description="how simulated checkpoints score on keep_best metrics"
    )
    prices: Annotated[dict[PricedTier, PriceOverride], Field(max_length=64)] | None = Field(
        None,
        description="what-if prices per tier, over the tiers' own; `*` for every tier, a "
        "tier's own entry winning over it figure by figure (a `catalog` it names starts "
        "that tier afresh from the entry)",
    )

    def to_spec(self) -> ForecastSpec:
        """The simulation this asks for; raises Invalid naming the field at fault."""
        if (self.checkpoint_bytes is None) == (self.parameters is None):
            raise Invalid("give checkpoint_bytes, or parameters", field="checkpoint_bytes")
        if self.bytes_per_parameter is not None and self.parameters is None:
            raise Invalid("only with parameters", field="bytes_per_parameter")
        size = self.checkpoint_bytes
        if self.parameters is not None:
            size = round(
                self.parameters * (self.bytes_per_parameter or DEFAULT_BYTES_PER_PARAMETER)
            )
            if not 1 <= size <= MAX_BYTES:
                raise Invalid(f"a checkpoint of {size} bytes", field="parameters")
        assert size is not None
        schedule = tuple(
            (klass, None if every == "end" else parse_duration(every))
            for klass, every in self.schedule.items()
        )
        return ForecastSpec(
            checkpoint_bytes=size,
            run_days=self.run_days,
            schedule=schedule,
            concurrent_runs=self.concurrent_runs,
            horizon_days=self.horizon_days,
            metrics=self.metrics,
        )

    def price_overrides(self) -> dict[str, dict[str, Any]]:
        return {
            tier: override.model_dump(exclude_none=True)
            for tier, override in (self.prices or {}).items()
        }


class UsageRead(BaseModel):
    bytes: int
    bytes_by_tier: dict[str, int]
    usd_month: float


class DayRead(UsageRead):
    day: int


class ScenarioRead(BaseModel):
    series: list[DayRead]
    at_run_end: UsageRead
    total_usd: float = Field(description="storage over the horizon plus one-off fees")
    storage_usd: float
    fees_usd: float = Field(description="retrieval, egress and early-deletion charges")


class ForecastRead(ScenarioRead):
    policy: str
    checkpoint_bytes: int
    run_days: int
    horizon_days: int
    concurrent_runs: int
    checkpoints_per_run: dict[str, int]
    keep_everything: ScenarioRead = Field(description="no policy, all on the hottest tier")
    savings_usd: float = Field(description="keep_everything.total_usd minus total_usd")
    skipped_demotions: int = Field(
        description="checkpoints per run a demotion skipped for its early-deletion penalty"
    )
    prices: dict[str, PriceQuoteRead]
    assumptions: list[str]


def _usage(usage: Usage) -> UsageRead:
    return UsageRead(
        bytes=usage.bytes, bytes_by_tier=dict(usage.bytes_by_tier), usd_month=usage.usd_month
    )


def _scenario(scenario: Scenario) -> dict[str, Any]:
    return {
        "series": [DayRead(day=p.day, **_usage(p.usage).model_dump()) for p in scenario.series],
        "at_run_end": _usage(scenario.at_run_end),
        "total_usd": scenario.total_usd,
        "storage_usd": scenario.storage_usd,
        "fees_usd": scenario.fees_usd,
    }


def forecast_read(result: Forecast, prices: dict[str, PriceQuote]) -> ForecastRead:
    spec = result.spec
    return ForecastRead(
        policy=result.policy,
        checkpoint_bytes=spec.checkpoint_bytes,
        run_days=spec.run_days,
        horizon_days=spec.horizon,
        concurrent_runs=spec.concurrent_runs,
        checkpoints_per_run=dict(result.written),
        keep_everything=ScenarioRead(**_scenario(result.keep_everything)),
        savings_usd=result.savings_usd,
        skipped_demotions=result.skipped_demotions,
        prices={tier: price_read(q) for tier, q in prices.items()},
        assumptions=list(result.assumptions),
        **_scenario(result.with_policy),
    )


# --- planner -------------------------------------------------------------------------------


class PlannerRequest(Strict):
    """Every input is optional; recipe and bytes_per_parameter exclude each other and need
    parameters, which excludes checkpoint_bytes."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                not_both("recipe", "bytes_per_parameter"),
                not_both("parameters", "checkpoint_bytes"),
                only_with("recipe", "parameters"),
                only_with("bytes_per_parameter", "parameters"),
            ]
        },
    )

    parameters: Parameters | None = Field(None, examples=[70e9])
    bytes_per_parameter: PerParameter | None = Field(None, description="default 14")
    recipe: Recipe | None = Field(
        None,
        description="bytes per parameter by what is saved: "
        + ", ".join(f"{k} = {v}" for k, v in BYTES_PER_PARAMETER.items()),
    )
    checkpoint_bytes: Whole | None = Field(None, description="instead of parameters")
    interval: DurationText | None = Field(None, description="time between checkpoints")
    allowed_overlap: (
        Annotated[float, Field(ge=1e-9, le=1, allow_inf_nan=False, strict=True)] | None
    ) = Field(None, description="fraction of training time spent writing, e.g. 0.1")
    checkpoint_write_seconds: Positive | None = None
    mtbf: DurationText | None = Field(None, description="mean time between failures")
    checkpoints: Annotated[int, Field(ge=0, le=10**12), BeforeValidator(_whole)] | None = None
    gpus: Annotated[int, Field(ge=1, le=10**9), BeforeValidator(_whole)] | None = None
    usd_per_gpu_hour: Money | None = None

    def to_inputs(self) -> SizingInputs:
        """Raises Invalid for inputs that contradict each other. No inputs at all is a
        question with no outputs (each output is present when its inputs are given)."""
        if self.recipe is not None and self.bytes_per_parameter is not None:
            raise Invalid("give recipe or bytes_per_parameter, not both", field="recipe")
        if self.parameters is not None and self.checkpoint_bytes is not None:
            raise Invalid("give parameters or checkpoint_bytes, not both", field="checkpoint_bytes")
        per_parameter = self.bytes_per_parameter
        if self.recipe is not None:
            per_parameter = BYTES_PER_PARAMETER[self.recipe]
        if per_parameter is not None and self.parameters is None:
            field = "recipe" if self.recipe is not None else "bytes_per_parameter"
            raise Invalid("only with parameters", field=field)
        if self.parameters is not None:
            size = round(self.parameters * (per_parameter or DEFAULT_BYTES_PER_PARAMETER))
            if size > MAX_BYTES:
                raise Invalid(
                    f"a checkpoint of {size:.3g} bytes; at most {MAX_BYTES:.0e}", field="parameters"
                )
        return SizingInputs(
            parameters=self.parameters,
            bytes_per_parameter=per_parameter,
            checkpoint_bytes=self.checkpoint_bytes,
            interval=parse_duration(self.interval) if self.interval else None,
            allowed_overlap=self.allowed_overlap,
            checkpoint_write_seconds=self.checkpoint_write_seconds,
            mtbf=parse_duration(self.mtbf) if self.mtbf else None,
            checkpoints=self.checkpoints,
            gpus=self.gpus,
            usd_per_gpu_hour=self.usd_per_gpu_hour,
        )


class PlannerRead(BaseModel):
    """Each output is present when all its inputs were given."""

    bytes_per_parameter: float | None = None
    checkpoint_bytes: int | None = None
    write_bandwidth_bytes_per_s: float | None = None
    young_daly_interval_s: float | None = None
    sync_stall_gpu_hours: float | None = None
    sync_stall_usd: float | None = None
    incomplete: dict[str, list[str]] = Field(
        default_factory=dict, description="output -> inputs it still needs"
    )


def planner_read(sizing: Sizing) -> PlannerRead:
    return PlannerRead(
        bytes_per_parameter=sizing.bytes_per_parameter,
        checkpoint_bytes=sizing.checkpoint_bytes,
        write_bandwidth_bytes_per_s=sizing.write_bandwidth_bytes_per_s,
        young_daly_interval_s=sizing.young_daly_interval_s,
        sync_stall_gpu_hours=sizing.sync_stall_gpu_hours,
        sync_stall_usd=sizing.sync_stall_usd,
        incomplete=dict(sizing.incomplete),
    )
