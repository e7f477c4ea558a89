"""Cost reports, forecasts and sizing (section 7b)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.cost_schemas import (
    CostReportRead,
    ForecastRead,
    ForecastRequest,
    forecast_read,
    report_read,
)
from app.api.deps import NowDep, PrincipalDep, SessionDep, TiersDep
from app.api.planner_schemas import PlannerRead, PlannerRequest, planner_read
from app.api.schemas import NAME_PATTERN
from app.cost.forecast import forecast
from app.cost.planner import size
from app.services.cost.inputs import resolve_policy, tier_billing, tier_prices
from app.services.cost.report import GroupBy, cost_report

router = APIRouter(tags=["cost"])


@router.get("/v1/reports/cost")
def report_cost(
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
    group_by: GroupBy = "tier",
    project: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> CostReportRead:
    """Bytes, checkpoints and USD a month per group at the tiers' prices, trashed
    checkpoints included (they are still billed), and in rows of kind `deleted_billed` the
    bytes a provider still bills after the service removed them (GCS soft delete, noncurrent
    versions); never rounded. A token bounded to some projects sees what those projects
    store."""
    report = cost_report(
        session,
        tiers=tiers,
        now=now,
        group_by=group_by,
        project=project,
        projects=principal.projects,
    )
    return report_read(report)


@router.post("/v1/forecast")
def forecast_cost(body: ForecastRequest, session: SessionDep, tiers: TiersDep) -> ForecastRead:
    """What a run (or N runs started together) will store and cost under a policy, day by
    day, beside keeping everything on the hottest tier: the policy engine replayed over
    simulated checkpoints. Deleted bytes stay billed as long as each tier's provider keeps
    them (its settings, or the `billed_after_delete` what-if). Writes nothing."""
    spec = body.to_spec()
    policy = resolve_policy(session, tiers, body.policy)
    prices = tier_prices(tiers, body.price_overrides())
    billed = tier_billing(tiers, body.billing_overrides())
    return forecast_read(forecast(spec, policy, tiers, prices, billed), prices, billed)


@router.post("/v1/planner", response_model_exclude_none=True)
def plan_sizing(body: PlannerRequest) -> PlannerRead:
    """Checkpoint size, write bandwidth, Young/Daly interval and synchronous-save stall cost;
    each output is present when its inputs are given."""
    return planner_read(size(body.to_inputs()))
