"""Checkpoints: register, commit, keep alive, abort, list, get, update, pin."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import State

from app.api.convert import checkpoint_read
from app.api.deps import (
    Cursor,
    EvaluateLater,
    Limit,
    NowDep,
    PrincipalDep,
    SessionDep,
    SettingsDep,
    StoragesDep,
    TiersDep,
)
from app.api.errors import not_json, sent_json
from app.api.schemas import (
    AbortRequest,
    CheckpointCommit,
    CheckpointCreate,
    CheckpointRead,
    CheckpointState,
    CheckpointUpdate,
    FileEntry,
    Name,
    Page,
    PinCreate,
)
from app.db.session import session_scope
from app.domain.access import Principal
from app.services.catalog import checkpoint_update, checkpoints, reservations
from app.services.catalog.checkpoints import Registration
from app.services.catalog.lookup import get_checkpoint as find_checkpoint
from app.services.lifecycle.resave import register_or_take_back
from app.settings import Settings

router = APIRouter(tags=["checkpoints"])


def _manifest(files: list[FileEntry] | None) -> list[dict[str, Any]] | None:
    return None if files is None else [dict(f) for f in files]


def _registration(request: Request, body: bytes) -> CheckpointCreate:
    """The registration body, parsed and validated in one pass by pydantic's own JSON
    parser: the hot path of the service, with a 64-file manifest per call."""
    if not sent_json(request):
        raise not_json(request)
    try:
        return CheckpointCreate.model_validate_json(body)
    except ValidationError as error:
        raise RequestValidationError(
            [{**item, "loc": ("body", *item["loc"])} for item in error.errors()]
        ) from None


_REGISTRATION_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CheckpointCreate"}}
        },
    }
}


def registration_of(body: CheckpointCreate) -> Registration:
    return Registration(
        step=body.step,
        klass=body.class_,
        uri=body.uri,
        files=_manifest(body.files),
        size_bytes=body.size_bytes,
        metrics=body.metrics,
        labels=body.labels,
        created_at=body.created_at,
        committed=body.committed,
    )


def make_registration(
    state: State, run_id: str, body: CheckpointCreate, actor: str
) -> tuple[CheckpointRead, bool]:
    """The registration in its own session, committed (or rolled back) here; blocking, for
    a worker thread. (On PostgreSQL its insert runs on an autocommit connection of its own,
    so this session's commit does no I/O.) Served by the route below and, for most
    requests, by app.api.fast_registration."""
    settings: Settings = state.settings
    registration = registration_of(body)
    with session_scope(state.session_factory) as session:
        checkpoint, created = register_or_take_back(
            session,
            tiers=state.tiers,
            storages=state.storages,
            run_id=run_id,
            reg=registration,
            actor=actor,
            now=datetime.now(UTC),
            reservation_ttl=settings.reservation_ttl,
        )
        return checkpoint_read(checkpoint), created


@router.post(
    "/v1/runs/{run_id}/checkpoints",
    status_code=status.HTTP_201_CREATED,
    response_model=CheckpointRead,
    responses={200: {"model": CheckpointRead, "description": "already registered, same content"}},
    openapi_extra=_REGISTRATION_BODY,
)
async def register_checkpoint(run_id: str, request: Request) -> Response:
    """Registration, the route every training job calls at every save, takes no
    dependency of its own: FastAPI's resolution of each costs the event loop more than the
    rest of the request (a sampling profile under 32 clients). The app-wide access check
    has run; its caller is on the request."""
    body = _registration(request, await request.body())
    principal: Principal = request.state.principal
    answer, created = await anyio.to_thread.run_sync(
        make_registration, request.app.state, run_id, body, principal.actor
    )
    request.app.state.runtime.request_evaluation(run_id)  # committed: evaluate the run
    return Response(
        answer.model_dump_json(by_alias=True),
        status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        media_type="application/json",
    )


@router.get("/v1/runs/{run_id}/checkpoints")
def list_checkpoints(
    run_id: str,
    session: SessionDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    klass: Annotated[Name | None, Query(alias="class")] = None,
    state: CheckpointState | None = None,
) -> Page[CheckpointRead]:
    items, next_cursor = checkpoints.list_checkpoints(
        session, run_id=run_id, klass=klass, state=state, limit=limit, cursor=cursor
    )
    return Page[CheckpointRead](items=[checkpoint_read(c) for c in items], next_cursor=next_cursor)


@router.get("/v1/checkpoints/{checkpoint_id}")
def get_checkpoint(checkpoint_id: str, session: SessionDep) -> CheckpointRead:
    return checkpoint_read(find_checkpoint(session, checkpoint_id))


@router.patch("/v1/checkpoints/{checkpoint_id}")
def update_checkpoint(
    checkpoint_id: str,
    body: CheckpointUpdate,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    evaluate_later: EvaluateLater,
) -> CheckpointRead:
    """Re-class it, merge labels and metrics (a key given null is removed); the run is
    evaluated again. 409 for a deleted checkpoint."""
    checkpoint = checkpoint_update.update_checkpoint(
        session,
        checkpoint_id=checkpoint_id,
        changes=body.model_dump(exclude_unset=True, by_alias=True),
        actor=principal.actor,
        now=now,
    )
    evaluate_later(checkpoint.run_id)
    return checkpoint_read(checkpoint)


@router.post("/v1/checkpoints/{checkpoint_id}/commit")
def commit_checkpoint(
    checkpoint_id: str,
    session: SessionDep,
    tiers: TiersDep,
    storages: StoragesDep,
    principal: PrincipalDep,
    now: NowDep,
    evaluate_later: EvaluateLater,
    body: CheckpointCommit | None = None,
) -> CheckpointRead:
    body = body or CheckpointCommit()  # every field is optional, so is the body
    checkpoint = reservations.commit_checkpoint(
        session,
        tiers=tiers,
        storages=storages,
        checkpoint_id=checkpoint_id,
        files=_manifest(body.files),
        size_bytes=body.size_bytes,
        metrics=body.metrics,
        actor=principal.actor,
        now=now,
    )
    evaluate_later(checkpoint.run_id)
    return checkpoint_read(checkpoint)


@router.post("/v1/checkpoints/{checkpoint_id}/keepalive")
def keep_alive(
    checkpoint_id: str, session: SessionDep, now: NowDep, settings: SettingsDep
) -> CheckpointRead:
    """A `writing` checkpoint's reservation lasts `CKPT_RESERVATION_TTL` from now; 409 in
    any other state."""
    return checkpoint_read(
        reservations.keep_alive(
            session, checkpoint_id=checkpoint_id, ttl=settings.reservation_ttl, now=now
        )
    )


@router.post("/v1/checkpoints/{checkpoint_id}/abort")
def abort_checkpoint(
    checkpoint_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    body: AbortRequest | None = None,
) -> CheckpointRead:
    """The save failed: a `writing` checkpoint goes to the trash, and its partial bytes are
    purged after `CKPT_TRASH_RETENTION`; 409 in any other state, or while pinned."""
    return checkpoint_read(
        reservations.abort_reservation(
            session,
            checkpoint_id=checkpoint_id,
            reason=body.reason if body is not None else None,
            actor=principal.actor,
            now=now,
        )
    )


@router.post("/v1/checkpoints/{checkpoint_id}/pin")
def pin_checkpoint(
    checkpoint_id: str, body: PinCreate, session: SessionDep, principal: PrincipalDep, now: NowDep
) -> CheckpointRead:
    return checkpoint_read(
        checkpoints.set_pin(
            session,
            checkpoint_id=checkpoint_id,
            reason=body.reason,
            actor=principal.actor,
            now=now,
        )
    )


@router.delete("/v1/checkpoints/{checkpoint_id}/pin")
def unpin_checkpoint(
    checkpoint_id: str, session: SessionDep, principal: PrincipalDep, now: NowDep
) -> CheckpointRead:
    return checkpoint_read(
        checkpoints.set_pin(
            session, checkpoint_id=checkpoint_id, reason=None, actor=principal.actor, now=now
        )
    )
