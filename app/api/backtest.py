"""Backtests (section 17): a candidate policy replayed over the catalog's own history."""

from __future__ import annotations

from dataclasses import asdict
from datetime import date, datetime
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.api.cost_fields import policy_ref
from app.api.deps import NowDep, PrincipalDep, SessionDep, SettingsDep, TiersDep
from app.api.schemas import Name, Timestamp
from app.api.shadow_schemas import RegretRead
from app.cost.usage_series import UsageSeries
from app.services.catalog import runs
from app.services.cost.backtest import ASSUMPTIONS, BacktestResult, backtest
from app.services.cost.inputs import resolve_policy

router = APIRouter(tags=["cost"])


class BacktestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Annotated[Name | dict[str, Any], BeforeValidator(policy_ref)] = Field(
        description="the candidate: a stored policy's name, or a policy inline"
    )
    project: Name | None = None
    run_id: Annotated[str, Field(max_length=40)] | None = None
    since: Timestamp | None = Field(None, description="default: the first event in scope")
    until: Timestamp | None = Field(None, description="default (and at most): now")


class BacktestDay(BaseModel):
    day: date = Field(description="a UTC calendar day; usage at its end")
    bytes: int
    bytes_by_tier: dict[str, int]
    usd_month: float


class BacktestSeries(BaseModel):
    series: list[BacktestDay]
    total_usd: float = Field(description="storage over the window at the tiers' prices")


class BacktestRead(BacktestSeries):
    policy: str
    since: datetime
    until: datetime
    actual: BacktestSeries
    savings_usd: float = Field(description="actual total_usd minus the candidate's")
    regrets: list[RegretRead]
    runs: int
    checkpoints: int
    actions: int = Field(description="deletes, moves and copies the candidate made")
    assumptions: list[str]


@router.post("/v1/backtest")
def run_backtest(
    body: BacktestRequest,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
    settings: SettingsDep,
) -> BacktestRead:
    """What the candidate policy would have done to the runs the catalog had: the history
    (registrations, commits, run ends, pins, a person's deletes, undeletes and restores,
    resumed runs) replayed through the engine, day by day beside what actually happened,
    and its regrets. Writes nothing. A token bounded to some projects replays those."""
    project, run_id = runs.resolve_scope(session, project=body.project, run_id=body.run_id)
    policy = resolve_policy(session, tiers, body.policy)
    result = backtest(
        session,
        policy,
        tiers=tiers,
        now=now,
        trash_retention=settings.trash_retention,
        project=project,
        run_id=run_id,
        projects=principal.projects,
        since=body.since,
        until=body.until,
    )
    return backtest_read(result)


def _series(usage: UsageSeries) -> BacktestSeries:
    return BacktestSeries(
        series=[
            BacktestDay(
                day=p.day,
                bytes=p.bytes,
                bytes_by_tier=dict(p.bytes_by_tier),
                usd_month=p.usd_month,
            )
            for p in usage.series
        ],
        total_usd=usage.total_usd,
    )


def backtest_read(result: BacktestResult) -> BacktestRead:
    candidate = _series(result.candidate)
    return BacktestRead(
        policy=result.policy,
        since=result.since,
        until=result.until,
        series=candidate.series,
        total_usd=candidate.total_usd,
        actual=_series(result.actual),
        savings_usd=result.savings_usd,
        regrets=[RegretRead(**asdict(r)) for r in result.regrets],
        runs=result.runs,
        checkpoints=result.checkpoints,
        actions=result.actions,
        assumptions=list(ASSUMPTIONS),
    )
