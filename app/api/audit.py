"""The audit trail: who changed what, when and why (admin only, see app.api.auth)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from app.api.deps import Cursor, IdFilter, Limit, SessionDep
from app.api.schemas import Page, Timestamp
from app.db.models import AuditEvent
from app.services.catalog import audit

router = APIRouter(tags=["audit"])


class AuditEventRead(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description="a token (`token:<id>:<name>`), a rule, or the system")
    entity: Literal["checkpoint", "run", "policy", "token", "action"]
    entity_id: str
    event: str = Field(description="what happened: created, updated, registered, moved, ...")
    checkpoint_id: str | None
    run_id: str | None
    before: dict[str, Any] | None = Field(description="the changed fields before the change")
    after: dict[str, Any] | None = Field(description="the changed fields after the change")
    reason: str | None = Field(
        description="why: the rule (`<policy>/<rule>` or `manual`) of the action behind it"
    )


@router.get("/v1/audit")
def list_audit(
    session: SessionDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    checkpoint_id: IdFilter = None,
    run_id: IdFilter = None,
    actor: Annotated[
        str | None,
        Query(max_length=200, description="an actor, or a prefix ending in `*` (`rule:*`)"),
    ] = None,
    since: Annotated[
        Timestamp | None, Query(description="ISO 8601; without an offset it is UTC")
    ] = None,
) -> Page[AuditEventRead]:
    """Oldest first. A checkpoint's trail includes the events of its actions."""
    rows, next_cursor = audit.list_events(
        session,
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        actor=actor,
        since=since,
        limit=limit,
        cursor=cursor,
    )
    return Page[AuditEventRead](items=[_read(e) for e in rows], next_cursor=next_cursor)


def _read(row: AuditEvent) -> AuditEventRead:
    return AuditEventRead.model_validate(row, from_attributes=True)
