"""Bodies of the lifecycle endpoints: policies, plans, sweeps, actions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas import Name, Timestamp

ActionKind = Literal["delete", "purge", "move", "copy", "restore"]
ActionState = Literal["held", "pending", "running", "done", "failed", "cancelled"]


class PolicyRead(BaseModel):
    name: str
    mode: Literal["enforce", "shadow"] = Field(
        description="`shadow`: governs no run; its would-be actions are recorded only "
        "(GET /v1/policies/{name}/shadow)"
    )
    source: str
    updated_at: datetime
    updated_by: str | None
    policy: dict[str, Any]


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: Name | None = None
    run_id: Annotated[str, Field(max_length=40)] | None = None
    policy: Name | dict[str, Any] | None = None


class PlanActionRead(BaseModel):
    checkpoint_id: str
    run_id: str
    step: int
    kind: str
    from_tier: str | None
    to_tier: str | None
    rule: str
    reason: str
    bytes: int
    state: str
    usd_month: float = Field(
        description="the monthly storage change it makes at the tiers' prices, negative for a "
        "saving: a delete frees every location (primary and replicas), and since it trashes "
        "now and purges after CKPT_TRASH_RETENTION, the saving starts at the purge (on a tier "
        "whose provider keeps billing deleted bytes, soft delete or old versions, that much "
        "later, or never while old versions stay: the reason says when); a move is (target "
        "price - source price) x bytes, its source's saving likewise; a copy adds bytes at "
        "the target's price"
    )
    one_off_usd: float = Field(
        description="the one-off charges it incurs: early deletion (on every tier a delete "
        "frees, or the source a move leaves), retrieval, egress between providers, requests"
    )


class KeptRead(BaseModel):
    checkpoint_id: str
    step: int
    reasons: list[str]


class SkippedRead(BaseModel):
    checkpoint_id: str
    rule: str
    reason: str


class PlanTotals(BaseModel):
    """Bytes are keyed by the tier they leave for deletes and moves and by the tier they
    reach for copies; dollars by the tier whose bill changes. Never rounded."""

    deleted_bytes_by_tier: dict[str, int] = Field(
        description="bytes deleted, keyed by the source: the checkpoint's primary tier "
        "(the replicas a delete frees too count in usd_month_by_tier)"
    )
    moved_bytes_by_tier: dict[str, int] = Field(
        description="bytes moved, keyed by the source: the tier they leave"
    )
    copied_bytes_by_tier: dict[str, int] = Field(
        description="bytes copied, keyed by the destination: the tier that gains a replica"
    )
    usd_month_by_tier: dict[str, float] = Field(
        description="the actions' usd_month summed per tier whose bill changes: a delete "
        "lowers every tier it frees, a move lowers its source and raises its destination, "
        "a copy raises its destination; 0 for a tier without a storage price"
    )
    one_off_usd: float = Field(description="the actions' one_off_usd summed")


class PlanRead(BaseModel):
    actions: list[PlanActionRead]
    kept: list[KeptRead]
    skipped: list[SkippedRead]
    totals: PlanTotals


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: Name | None = None
    run_id: Annotated[str, Field(max_length=40)] | None = None


class SweepRead(BaseModel):
    id: str
    actions: list[str]


class ActionRead(BaseModel):
    id: str
    checkpoint_id: str
    run_id: str
    kind: ActionKind
    from_tier: str | None
    to_tier: str | None
    rule: str
    reason: str | None
    state: ActionState
    step: int = Field(description="the checkpoint's step, as in a plan's actions")
    phase: str | None = Field(
        description="the last phase the worker finished: `copied`, `verified`, `switched`, "
        "`restoring/<polls>`; null before the first"
    )
    attempts: int
    retries: int = Field(description="storage requests retried (throttling, 5xx, timeouts)")
    error: str | None
    bytes: int
    bytes_done: int = Field(description="bytes transferred so far, while `running`")
    sweep_id: str | None
    due_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    actor: str | None = Field(
        description="who asked for it: a token, or `rule:<policy>/<rule>` for a policy's"
    )
    approved_by: str | None = Field(description="who released it, when it was held")


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tier: Name
    at: Timestamp | None = None
