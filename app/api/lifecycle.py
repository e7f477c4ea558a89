"""Plans, sweeps, the action ledger, and a person's delete / undelete / restore."""

from __future__ import annotations

from fastapi import APIRouter, status
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.api.convert import checkpoint_read
from app.api.deps import (
    Cursor,
    IdFilter,
    Limit,
    NowDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    TiersDep,
)
from app.api.lifecycle_schemas import (
    ActionKind,
    ActionRead,
    ActionState,
    PlanRead,
    PlanRequest,
    RestoreRequest,
    SweepRead,
    SweepRequest,
)
from app.api.plan_json import plan_response
from app.api.schemas import CheckpointRead, Page
from app.db.models import Action, Checkpoint
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.catalog import policies, runs
from app.services.lifecycle import ledger, requests
from app.services.lifecycle.planning import plan_catalog
from app.services.lifecycle.sweep import run_sweep

router = APIRouter(tags=["lifecycle"])


def action_reads(session: Session, actions: list[Action]) -> list[ActionRead]:
    """The ledger keeps the worker's phase in its `step` column; the answer's `step` is the
    checkpoint's (as in a plan), read for the whole page in one query."""
    ids = sorted({a.checkpoint_id for a in actions})
    steps: dict[str, int] = {}
    if ids:
        query = select(Checkpoint.id, Checkpoint.step).where(Checkpoint.id.in_(ids))
        steps = {checkpoint_id: step for checkpoint_id, step in session.execute(query)}
    return [
        ActionRead(
            id=a.id,
            checkpoint_id=a.checkpoint_id,
            run_id=a.run_id,
            kind=a.kind,
            from_tier=a.from_tier,
            to_tier=a.to_tier,
            rule=a.rule,
            reason=a.reason,
            state=a.state,
            step=steps[a.checkpoint_id],
            phase=a.step,
            attempts=a.attempts,
            retries=a.retries,
            error=a.error,
            bytes=a.bytes,
            bytes_done=a.bytes_done,
            sweep_id=a.sweep_id,
            due_at=a.due_at,
            created_at=a.created_at,
            updated_at=a.updated_at,
            finished_at=a.finished_at,
            actor=a.actor,
            approved_by=a.approved_by,
        )
        for a in actions
    ]


def action_read(session: Session, action: Action) -> ActionRead:
    return action_reads(session, [action])[0]


def _what_if(
    session: Session, tiers: list[Tier], policy: str | dict[str, object] | None
) -> Policy | None:
    if policy is None:
        return None
    return policies.resolve_policy(session, [t.name for t in tiers], policy)


@router.post("/v1/plan", response_model=PlanRead)
def plan(
    body: PlanRequest,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
    settings: SettingsDep,
) -> StreamingResponse:
    """Dry run: what would happen now, and why each checkpoint stays or goes. Writes nothing.
    Without a project or run, a token bounded to some projects gets the plan of those.
    The answer is written from the plan as it is sent (app.api.plan_json): a whole
    catalog's is a million entries."""
    project, run_id = runs.resolve_scope(session, project=body.project, run_id=body.run_id)
    what_if = _what_if(session, tiers, body.policy)
    return plan_response(
        lambda: plan_catalog(
            session,
            tiers=tiers,
            now=now,
            project=project,
            run_id=run_id,
            policy=what_if,
            projects=principal.projects,
            trash_retention=settings.trash_retention,
            keep_read=True,
            kept_as_json=True,
        )
    )


@router.post("/v1/sweeps", status_code=status.HTTP_202_ACCEPTED)
def sweep(
    factory: SessionFactoryDep,
    runtime: RuntimeDep,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
    body: SweepRequest | None = None,
) -> SweepRead:
    """Evaluate now; when this answers, every planned action is in the ledger."""
    body = body or SweepRequest()
    project, run_id = runs.resolve_scope(session, project=body.project, run_id=body.run_id)
    session.rollback()  # the sweep runs in transactions of its own
    sweep_id, ids = run_sweep(
        factory,
        tiers=tiers,
        now=now,
        trigger="manual",
        actor=principal.actor,
        project=project,
        run_id=run_id,
    )
    runtime.wake_workers()
    return SweepRead(id=sweep_id, actions=ids)


@router.post("/v1/sweeps/{sweep_id}/approve")
def approve_sweep(
    sweep_id: str, session: SessionDep, principal: PrincipalDep, now: NowDep
) -> SweepRead:
    return SweepRead(
        id=sweep_id, actions=ledger.approve_sweep(session, sweep_id, principal.actor, now)
    )


@router.get("/v1/actions")
def list_actions(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    state: ActionState | None = None,
    kind: ActionKind | None = None,
    checkpoint_id: IdFilter = None,
    run_id: IdFilter = None,
) -> Page[ActionRead]:
    rows, next_cursor = ledger.list_actions(
        session,
        state=state,
        kind=kind,
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        limit=limit,
        cursor=cursor,
        projects=principal.projects,
    )
    return Page[ActionRead](items=action_reads(session, rows), next_cursor=next_cursor)


@router.get("/v1/actions/{action_id}")
def get_action(action_id: str, session: SessionDep) -> ActionRead:
    return action_read(session, ledger.get_action(session, action_id))


@router.post("/v1/actions/{action_id}/approve")
def approve_action(
    action_id: str, session: SessionDep, principal: PrincipalDep, now: NowDep
) -> ActionRead:
    return action_read(session, ledger.approve_action(session, action_id, principal.actor, now))


@router.delete("/v1/checkpoints/{checkpoint_id}", status_code=status.HTTP_202_ACCEPTED)
def delete_checkpoint(
    checkpoint_id: str, session: SessionDep, principal: PrincipalDep, now: NowDep
) -> ActionRead:
    """To the trash (restorable until the trash period ends); 409 while pinned."""
    return action_read(
        session, requests.request_delete(session, checkpoint_id, principal.actor, now)
    )


@router.post("/v1/checkpoints/{checkpoint_id}/undelete")
def undelete_checkpoint(
    checkpoint_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    settings: SettingsDep,
) -> CheckpointRead:
    """Back from the trash, and protected from policy deletes and moves for
    `CKPT_TRASH_RETENTION` (`protected_until` in the answer). An aborted reservation comes
    back `writing`, reserved for `CKPT_RESERVATION_TTL` (`reserved_until`)."""
    checkpoint = requests.undelete(
        session,
        checkpoint_id,
        principal.actor,
        now,
        protect_for=settings.trash_retention,
        reservation_ttl=settings.reservation_ttl,
    )
    return checkpoint_read(checkpoint)


@router.post("/v1/checkpoints/{checkpoint_id}/restore", status_code=status.HTTP_202_ACCEPTED)
def restore_checkpoint(
    checkpoint_id: str,
    body: RestoreRequest,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
) -> ActionRead:
    """Stage a copy onto `tier`, now or at `at`."""
    return action_read(
        session,
        requests.request_restore(
            session,
            checkpoint_id=checkpoint_id,
            tier=body.tier,
            at=body.at,
            tiers=tiers,
            actor=principal.actor,
            now=now,
        ),
    )
