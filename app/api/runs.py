"""Runs: idempotent create, list, get, patch."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from pydantic import Field

from app.api.convert import run_read
from app.api.deps import Cursor, EvaluateLater, Limit, NowDep, PrincipalDep, SessionDep
from app.api.schemas import Name, Page, RunCreate, RunRead, RunStatus, RunUpdate
from app.services.catalog import runs

router = APIRouter(prefix="/v1/runs", tags=["runs"])

# `key:value`; a key holds no `"` or backslash, which no JSON path could carry on SQLite,
# and neither holds a NUL, which no label holds (PostgreSQL refuses one in a parameter).
LabelFilter = Annotated[
    str, Field(pattern=r'^[^:"\\\x00]{1,63}:[^\x00]{0,256}$', examples=["team:pretrain"])
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": RunRead, "description": "the run already existed"}},
)
def create_run(
    body: RunCreate,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    response: Response,
) -> RunRead:
    view, created = runs.create_run(
        session,
        **body.model_dump(),
        actor=principal.actor,
        now=now,
        projects=principal.projects,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return run_read(view)


@router.get("")
def list_runs(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    project: Name | None = None,
    status: RunStatus | None = None,
    label: Annotated[
        list[LabelFilter] | None,
        Query(max_length=64, description="`key:value`, repeatable: every one must match"),
    ] = None,
) -> Page[RunRead]:
    views, next_cursor = runs.list_runs(
        session,
        project=project,
        status=status,
        labels=[(key, value) for key, _, value in (i.partition(":") for i in label or [])],
        limit=limit,
        cursor=cursor,
        projects=principal.projects,
    )
    return Page[RunRead](items=[run_read(v) for v in views], next_cursor=next_cursor)


@router.get("/{run_id}")
def get_run(run_id: str, session: SessionDep) -> RunRead:
    return run_read(runs.get_run(session, run_id))


@router.patch("/{run_id}")
def update_run(
    run_id: str,
    body: RunUpdate,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    evaluate_later: EvaluateLater,
) -> RunRead:
    """A change of status, labels or policy re-evaluates the run, as a registration does."""
    changes = body.model_dump(exclude_unset=True)
    view = runs.update_run(
        session,
        run_id=run_id,
        changes=changes,
        actor=principal.actor,
        now=now,
        projects=principal.projects,
    )
    evaluate_later(run_id)
    return run_read(view)
