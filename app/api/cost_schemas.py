"""Bodies of the cost endpoints: prices, reports, forecasts (the planner's are in
planner_schemas.py). Requests refuse unknown fields."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.api.cost_fields import (
    MAX_BYTES,
    BilledFor,
    Days,
    Interval,
    Money,
    Parameters,
    PerParameter,
    PricedTier,
    Whole,
    policy_ref,
    whole,
)
from app.api.schemas import (
    Name,
    PriceRead,
    Strict,
    TierRead,
    not_both,
    only_with,
    present,
)
from app.cost.forecast import Forecast, ForecastSpec, Scenario, Usage
from app.cost.planner import (
    DEFAULT_BYTES_PER_PARAMETER,
)
from app.cost.prices import PriceQuote
from app.domain.duration import format_duration, parse_duration
from app.domain.errors import Invalid
from app.services.cost.report import CostReport, GroupBy, RowKind

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
    min_storage_days: Annotated[int, Field(ge=0, le=36_500), BeforeValidator(whole)] | None = None
    min_object_bytes: Annotated[int, Field(ge=0, le=MAX_BYTES), BeforeValidator(whole)] | None = (
        None
    )
    write_requests_per_1000: Money | None = None
    read_requests_per_1000: Money | None = None


# --- reports -------------------------------------------------------------------------------


class CostRowRead(BaseModel):
    key: str
    name: str | None = Field(None, description="a run's <project>/<run name>")
    kind: RowKind = Field(
        "stored",
        description="`stored`: active and trashed checkpoints; `deleted_billed`: bytes the "
        "service removed (a purge, a move's source) that the tier's provider still keeps and "
        "bills (GCS soft delete, noncurrent versions). A group may have a row of each kind; "
        "the deleted_billed rows come after every stored row",
    )
    bytes: int = Field(description="over every location, replicas included")
    checkpoints: int
    trashed_bytes: int = Field(description="part of bytes held by trashed checkpoints")
    usd_month: float
    billed_until: datetime | None = Field(
        None,
        description="deleted_billed rows: when the last of their bytes stops being billed; "
        "null when some are billed until someone removes them (noncurrent versions that no "
        "lifecycle rule expires), and on stored rows",
    )


class CostReportRead(BaseModel):
    group_by: GroupBy
    rows: list[CostRowRead]
    total_bytes: int = Field(description="every row's bytes, deleted_billed rows included")
    total_usd_month: float = Field(description="every row's usd_month: what is billed a month")
    deleted_billed_bytes: int = Field(0, description="the part of total_bytes deleted but billed")
    deleted_billed_usd_month: float = Field(
        0.0, description="the part of total_usd_month deleted but billed"
    )
    prices: dict[str, PriceQuoteRead]


def report_read(report: CostReport) -> CostReportRead:
    return CostReportRead(
        group_by=report.group_by,
        rows=[
            CostRowRead(
                key=r.key,
                name=r.name,
                kind=r.kind,
                bytes=r.bytes,
                checkpoints=r.checkpoints,
                trashed_bytes=r.trashed_bytes,
                usd_month=r.usd_month,
                billed_until=r.billed_until,
            )
            for r in report.rows
        ],
        total_bytes=report.total_bytes,
        total_usd_month=report.total_usd_month,
        deleted_billed_bytes=report.deleted_billed_bytes,
        deleted_billed_usd_month=report.deleted_billed_usd_month,
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
    policy: Annotated[Name | dict[str, Any] | None, BeforeValidator(policy_ref)] = Field(
        None, description="a stored policy's name (default: `default`) or a policy inline"
    )
    concurrent_runs: Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(whole)] = 1
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
    billed_after_delete: (
        Annotated[dict[PricedTier, BilledFor | None], Field(max_length=64)] | None
    ) = Field(
        None,
        description="what-if: how long each tier's provider keeps billing deleted bytes "
        "(GCS soft delete, S3 noncurrent versions), over the tiers' own settings (GET "
        "/v1/tiers: provider.billed_after_delete): a duration, `0s` for a bucket that "
        "forgets at once, or null for ever (to the horizon); `*` for every tier, a tier's own "
        "entry winning over it",
        examples=[{"hot": "7d"}, {"*": "0s"}],
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

    def billing_overrides(self) -> dict[str, str | None]:
        return dict(self.billed_after_delete or {})

    def price_overrides(self) -> dict[str, dict[str, Any]]:
        return {
            tier: override.model_dump(exclude_none=True)
            for tier, override in (self.prices or {}).items()
        }


class UsageRead(BaseModel):
    bytes: int = Field(description="the live checkpoints' bytes, every location")
    bytes_by_tier: dict[str, int]
    deleted_billed_bytes: int = Field(
        0,
        description="bytes deleted (or moved off) a tier whose provider still bills them, "
        "not part of bytes",
    )
    deleted_billed_bytes_by_tier: dict[str, int] = Field(default_factory=dict)
    usd_month: float = Field(description="bytes and deleted_billed_bytes at the tiers' prices")


class DayRead(UsageRead):
    day: int


class ScenarioRead(BaseModel):
    series: list[DayRead]
    at_run_end: UsageRead
    total_usd: float = Field(description="storage over the horizon plus one-off fees")
    storage_usd: float = Field(description="deleted_billed_usd included")
    deleted_billed_usd: float = Field(
        0.0, description="the part of storage_usd billed for deleted bytes"
    )
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
    billed_after_delete: dict[str, str | None] = Field(
        default_factory=dict,
        description="tier -> how long its deleted bytes stayed billed in this forecast "
        "(`0s`: not at all; null: for ever)",
    )
    assumptions: list[str]


def _usage(usage: Usage) -> UsageRead:
    return UsageRead(
        bytes=usage.bytes,
        bytes_by_tier=dict(usage.bytes_by_tier),
        deleted_billed_bytes=usage.deleted_billed_bytes,
        deleted_billed_bytes_by_tier=dict(usage.deleted_billed_by_tier),
        usd_month=usage.usd_month,
    )


def _scenario(scenario: Scenario) -> dict[str, Any]:
    return {
        "series": [DayRead(day=p.day, **_usage(p.usage).model_dump()) for p in scenario.series],
        "at_run_end": _usage(scenario.at_run_end),
        "total_usd": scenario.total_usd,
        "storage_usd": scenario.storage_usd,
        "deleted_billed_usd": scenario.deleted_billed_usd,
        "fees_usd": scenario.fees_usd,
    }


def forecast_read(
    result: Forecast,
    prices: dict[str, PriceQuote],
    billed_after_delete: Mapping[str, timedelta | None] | None = None,
) -> ForecastRead:
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
        billed_after_delete={
            tier: None if kept is None else format_duration(kept)
            for tier, kept in (billed_after_delete or {}).items()
        },
        assumptions=list(result.assumptions),
        **_scenario(result.with_policy),
    )


# --- planner -------------------------------------------------------------------------------
