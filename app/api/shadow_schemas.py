"""The answer of `GET /v1/policies/{name}/shadow` (DESIGN section 17)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

ShadowKind = Literal["delete", "move", "copy"]


class ShadowActionRead(BaseModel):
    """A would-be action: what the policy would have done, and when (the evaluation's time)."""

    id: str
    run_id: str
    checkpoint_id: str
    step: int
    kind: ShadowKind
    from_tier: str | None
    to_tier: str | None
    rule: str
    reason: str | None
    bytes: int
    created_at: datetime


class DivergentRead(BaseModel):
    checkpoint_id: str
    run_id: str
    step: int
    kind: ShadowKind
    from_tier: str | None
    to_tier: str | None
    rule: str
    at: datetime = Field(description="when the action was planned (or would have been)")


class DivergenceRead(BaseModel):
    bytes_freed: int = Field(
        description="bytes of its would-be deletes that are still stored (active or trashed)"
    )
    usd_month: float = Field(
        description="what those cost a month at their locations' tiers, plus the monthly "
        "saving of its would-be moves of checkpoints still on the move's source tier"
    )
    only_shadow: list[DivergentRead] = Field(
        description="its would-be actions with no real action of the same checkpoint, kind "
        "and target tier"
    )
    only_enforced: list[DivergentRead] = Field(
        description="rule-planned real actions on the runs it would govern now with no "
        "would-be action of the same checkpoint, kind and target tier"
    )


class RegretRead(BaseModel):
    """A checkpoint the policy would have deleted or moved that was used later (shadow
    policies and backtests alike: app.cost.regrets)."""

    checkpoint_id: str
    run_id: str
    step: int
    action: Literal["delete", "move"]
    to_tier: str | None
    would_delete_at: datetime = Field(description="when it would have deleted (or moved) it")
    used_at: datetime
    use: Literal["restored", "pinned", "resumed_from"]


class ShadowRead(BaseModel):
    policy: str
    mode: Literal["enforce", "shadow"]
    actions: list[ShadowActionRead]
    divergence: DivergenceRead
    regrets: list[RegretRead]
