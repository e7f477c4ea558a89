"""The ledger's actions: one row per thing asked of storage.

Creating, listing and approving actions, and finding or cancelling a checkpoint's open
ones: what sweeps, people's requests and the trash ask of the ledger.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, NotRequired, TypedDict, Unpack, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from app.db.bulk import bulk_insert
from app.db.models import Action, NewAction, Sweep
from app.db.pagination import decode_cursor, encode_cursor
from app.domain.errors import Conflict, NotFound
from app.domain.ids import new_id
from app.domain.states import OPEN_STATES, ActionKind, ActionState
from app.services.catalog import audit
from app.services.catalog.runs import runs_in


class ActionFields(TypedDict):
    """What a caller says of a new action; the ledger adds its id and bookkeeping."""

    checkpoint_id: str
    run_id: str
    kind: str
    from_tier: str | None
    to_tier: str | None
    rule: str
    reason: str | None
    state: str
    size: int
    actor: str | None
    now: datetime
    due_at: NotRequired[datetime | None]
    sweep_id: NotRequired[str | None]


def planned_action(**fields: Unpack[ActionFields]) -> NewAction:
    """A new action as plain data (a sweep writes thousands at once: insert_actions)."""
    now = fields["now"]
    return NewAction(
        id=new_id("act"),
        checkpoint_id=fields["checkpoint_id"],
        run_id=fields["run_id"],
        kind=fields["kind"],
        from_tier=fields["from_tier"],
        to_tier=fields["to_tier"],
        rule=fields["rule"],
        reason=fields["reason"],
        state=fields["state"],
        bytes=fields["size"],
        sweep_id=fields.get("sweep_id"),
        due_at=fields.get("due_at") or now,
        created_at=now,
        actor=fields["actor"],
    )


def new_action(**fields: Unpack[ActionFields]) -> Action:
    """The ORM object of a new action, for a caller that writes one and goes on with it."""
    return Action(**planned_action(**fields).row())


def insert_actions(session: Session, actions: Sequence[NewAction]) -> None:
    """Write new actions in one statement: a sweep that plans thousands would otherwise
    pay an ORM flush and a multi-row INSERT that psycopg parses client-side (app.db.bulk
    says why)."""
    bulk_insert(session, cast(Table, Action.__table__), [a.row() for a in actions])


def add_action(session: Session, action: Action, now: datetime) -> Action:
    """Put a new action in the ledger, and its creation in the audit trail."""
    session.add(action)
    audit.record_many(session, [audit.action_created(action, at=now)])
    return action


def get_action(session: Session, action_id: str) -> Action:
    action = session.get(Action, action_id)
    if action is None:
        raise NotFound(f"no action has id {action_id!r}", field="action_id")
    return action


def list_actions(
    session: Session,
    *,
    state: str | None,
    kind: str | None,
    checkpoint_id: str | None,
    run_id: str | None,
    limit: int,
    cursor: str | None,
    projects: Collection[str] | None = None,
) -> tuple[list[Action], str | None]:
    """Newest first; only actions on runs of `projects` when given (a bounded caller's)."""
    stmt = select(Action).order_by(Action.id.desc()).limit(limit + 1)
    if projects is not None:
        stmt = stmt.where(Action.run_id.in_(runs_in(projects)))
    for column, value in (
        (Action.state, state),
        (Action.kind, kind),
        (Action.checkpoint_id, checkpoint_id),
        (Action.run_id, run_id),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if cursor is not None:
        (last,) = decode_cursor(cursor, str)
        stmt = stmt.where(Action.id < last)
    rows = list(session.execute(stmt).scalars())
    page = rows[:limit]
    return page, encode_cursor(page[-1].id) if len(rows) > limit else None


def approve_action(session: Session, action_id: str, actor: str, now: datetime) -> Action:
    """Release a held delete. Approving one that is no longer held is a no-op."""
    action = get_action(session, action_id)
    if action.state == ActionState.HELD:
        release(session, action, actor, now)
        session.flush()
    return action


def _approved(action: Action, actor: str, now: datetime) -> dict[str, Any]:
    return audit.action_event(
        action,
        "approved",
        at=now,
        actor=actor,
        before={"state": "held"},
        after={"state": "pending", "approved_by": actor},
    )


def release(session: Session, action: Action, actor: str, now: datetime) -> None:
    action.state = "pending"
    action.due_at = now
    action.updated_at = now
    action.approved_by = actor
    audit.record_many(session, [_approved(action, actor, now)])


def approve_sweep(session: Session, sweep_id: str, actor: str, now: datetime) -> list[str]:
    if session.get(Sweep, sweep_id) is None:
        raise NotFound(f"no sweep has id {sweep_id!r}", field="sweep_id")
    held = list(
        session.execute(
            select(Action)
            .where(Action.sweep_id == sweep_id, Action.state == ActionState.HELD)
            .with_for_update()  # what is approved is exactly what is audited
        ).scalars()
    )
    ids = [a.id for a in held]
    session.execute(
        update(Action)
        .where(Action.id.in_(ids), Action.state == ActionState.HELD)
        .values(state=ActionState.PENDING, due_at=now, updated_at=now, approved_by=actor)
    )
    audit.record_many(session, [_approved(a, actor, now) for a in held])
    return ids


def open_action(
    session: Session, checkpoint_id: str, kind: str, to_tier: str | None
) -> Action | None:
    return (
        session.execute(
            select(Action).where(
                Action.checkpoint_id == checkpoint_id,
                Action.kind == kind,
                Action.to_tier == to_tier if to_tier is not None else Action.to_tier.is_(None),
                Action.state.in_(OPEN_STATES),
            )
        )
        .scalars()
        .first()
    )


def cancel_open(
    session: Session,
    checkpoint_id: str,
    kind: str,
    now: datetime,
    *,
    actor: str,
    busy: str,
    why: str,
) -> None:
    """Cancel the checkpoint's open actions of `kind`; Conflict (`busy`) if one is running."""
    actions = list(
        session.execute(
            select(Action).where(
                Action.checkpoint_id == checkpoint_id,
                Action.kind == kind,
                Action.state.in_(OPEN_STATES),
            )
        ).scalars()
    )
    if any(a.state == ActionState.RUNNING for a in actions):
        raise Conflict(busy, field="state")
    events = []
    for action in actions:
        events.append(
            audit.action_event(
                action,
                "cancelled",
                at=now,
                actor=actor,
                before={"state": action.state},
                after={"state": "cancelled", "error": why},
            )
        )
        action.state = "cancelled"
        action.error = why
        action.updated_at = now
        action.finished_at = now
    audit.record_many(session, events)
    session.flush()


def failed_purges(session: Session, checkpoint_ids: list[str]) -> dict[str, tuple[int, datetime]]:
    """Per checkpoint: how many purges failed, and when the last one did."""
    if not checkpoint_ids:
        return {}
    rows = session.execute(
        select(Action.checkpoint_id, func.count(), func.max(Action.finished_at))
        .where(
            Action.checkpoint_id.in_(checkpoint_ids),
            Action.kind == ActionKind.PURGE,
            Action.state == ActionState.FAILED,
        )
        .group_by(Action.checkpoint_id)
    )
    return {cid: (int(count), last) for cid, count, last in rows if last is not None}


def purge_action(
    session: Session, checkpoint_id: str, run_id: str, size: int, now: datetime
) -> Action:
    """A purge carries the rule and the actor of the delete that trashed the checkpoint:
    whoever decided the delete decided the purge."""
    delete = session.execute(
        select(Action.rule, Action.actor)
        .where(
            Action.checkpoint_id == checkpoint_id,
            Action.kind == ActionKind.DELETE,
            Action.state == ActionState.DONE,
        )
        .order_by(Action.finished_at.desc())
        .limit(1)
    ).one_or_none()
    rule, actor = delete if delete is not None else (None, None)
    return new_action(
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        kind=ActionKind.PURGE,
        from_tier=None,
        to_tier=None,
        rule=rule or "manual",
        reason="trash period over",
        state=ActionState.PENDING,
        size=size,
        actor=actor,  # None only after a delete recorded before actors were
        now=now,
    )


def count_by_kind_and_state(session: Session) -> dict[tuple[str, str], int]:
    """(kind, state) -> how many actions the ledger holds, over all of it (one grouped query)."""
    rows = session.execute(
        select(Action.kind, Action.state, func.count()).group_by(Action.kind, Action.state)
    )
    return {(kind, state): int(count) for kind, state, count in rows}
