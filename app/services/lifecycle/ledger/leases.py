"""A worker's side of the ledger: claiming an action, keeping its lease, recording its
steps, and ending it (done, failed, cancelled) or scheduling its retry. Each function is
one transaction of its own, so every phase is committed before the next begins."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from app import metrics
from app.db.dialect import skip_locked
from app.db.models import Action
from app.db.session import session_scope
from app.domain.states import ActionState
from app.services.catalog import audit
from app.services.catalog.due_runs import mark_changed

LEASE = timedelta(seconds=30)
MAX_ATTEMPTS = 5


def claim(factory: sessionmaker[Session], owner: str, now: datetime) -> str | None:
    """Take one due action (or one whose lease expired); None when there is none."""
    with session_scope(factory) as session:
        other = aliased(Action)
        busy = exists().where(
            other.checkpoint_id == Action.checkpoint_id,
            other.id != Action.id,
            other.state == ActionState.RUNNING,
            other.lease_until >= now,
        )
        stmt = (
            select(
                Action.id,
                Action.updated_at,
                Action.kind,
                Action.due_at,
                Action.lease_until,
                # for its audit event, in the same round trip
                Action.state,
                Action.step,
                Action.attempts,
                Action.rule,
                Action.actor,
                Action.checkpoint_id,
                Action.run_id,
            )
            .where(
                or_(
                    and_(Action.state == ActionState.PENDING, Action.due_at <= now),
                    and_(Action.state == ActionState.RUNNING, Action.lease_until < now),
                ),
                ~busy,
            )
            .order_by(Action.due_at)
            .limit(1)
        )
        row = session.execute(skip_locked(session, stmt, of=Action)).first()
        if row is None:
            return None
        claimed = session.execute(
            update(Action)
            .where(Action.id == row[0], Action.updated_at == row[1])
            .values(
                state=ActionState.RUNNING,
                lease_owner=owner,
                lease_until=now + LEASE,
                attempts=Action.attempts + 1,
                updated_at=now,
            )
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            return None
        metrics.action_claimed(row.kind, row.lease_until or row.due_at, now)
        if not (row.step or "").startswith("restoring/"):  # not each poll of a restore
            audit.record(
                session,
                actor=audit.acting_as(row.actor, row.rule),
                entity="action",
                entity_id=row.id,
                event="claimed",
                at=now,
                checkpoint_id=row.checkpoint_id,
                run_id=row.run_id,
                before={"state": row.state},
                after={"state": "running", "attempts": row.attempts + 1, "lease_owner": owner},
                reason=row.rule,
            )
        return str(row.id)


def load(factory: sessionmaker[Session], action_id: str) -> Action:
    with session_scope(factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        return action


def renew(
    factory: sessionmaker[Session], action_id: str, owner: str, now: datetime, bytes_done: int
) -> None:
    """Keep the lease of a running action this worker still owns, with its progress."""
    with session_scope(factory) as session:
        session.execute(
            update(Action)
            .where(
                Action.id == action_id,
                Action.lease_owner == owner,
                Action.state == ActionState.RUNNING,
            )
            .values(lease_until=now + LEASE, bytes_done=bytes_done)
        )


def set_step(
    factory: sessionmaker[Session], action_id: str, step: str, now: datetime, **values: object
) -> None:
    with session_scope(factory) as session:
        session.execute(
            update(Action)
            .where(Action.id == action_id)
            .values(step=step, lease_until=now + LEASE, updated_at=now, **values)
        )


def mark_step(action: Action, step: str, now: datetime) -> None:
    """Record `step` on an action loaded in the caller's transaction (which changes the
    catalog in the same commit)."""
    action.step = step
    action.lease_until = now + LEASE
    action.updated_at = now


def close(
    session: Session, action: Action, state: str, now: datetime, error: str | None = None
) -> None:
    """End the action `done`, `failed` or `cancelled`, and audit it as that state."""
    after: dict[str, object] = {"state": state}
    if error is not None:
        after["error"] = error
    audit.record_many(
        session,
        [audit.action_event(action, state, at=now, before={"state": action.state}, after=after)],
    )
    action.state = state
    action.error = error
    if state == ActionState.DONE:
        action.bytes_done = action.bytes
    action.finished_at = now
    action.updated_at = now
    action.lease_owner = None
    action.lease_until = None
    mark_changed(session, action.run_id, now)  # the run's plan may differ now


def finish(
    factory: sessionmaker[Session],
    action_id: str,
    state: str,
    now: datetime,
    *,
    error: str | None = None,
) -> None:
    with session_scope(factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        close(session, action, state, now, error)


def retry(factory: sessionmaker[Session], action_id: str, error: str, now: datetime) -> None:
    """Back to `pending` after a backoff that doubles with each attempt (at most 5 min);
    `failed` once MAX_ATTEMPTS are spent."""
    with session_scope(factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        was = action.state
        action.error = error
        action.updated_at = now
        action.lease_owner = None
        action.lease_until = None
        if action.attempts >= MAX_ATTEMPTS:
            action.state = ActionState.FAILED
            action.finished_at = now
            mark_changed(session, action.run_id, now)  # planned again after a backoff
            after: dict[str, object] = {"state": "failed", "error": error}
        else:
            action.state = ActionState.PENDING
            action.due_at = now + timedelta(seconds=min(2**action.attempts, 300))
            after = {"state": "pending", "error": error, "due_at": action.due_at}
        event = "failed" if action.state == ActionState.FAILED else "retry"
        audit.record_many(
            session,
            [audit.action_event(action, event, at=now, before={"state": was}, after=after)],
        )


def wait_for_restore(
    factory: sessionmaker[Session], action_id: str, polls: int, now: datetime, delay: timedelta
) -> None:
    """Back to `pending` until an archive restore completes: polled again after `delay`,
    and not counted as an attempt. The first wait is audited, not each poll."""
    with session_scope(factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        if polls == 0:
            after = {"state": "pending", "step": f"restoring/{polls}", "due_at": now + delay}
            audit.record_many(
                session,
                [
                    audit.action_event(
                        action, "waiting", at=now, before={"state": action.state}, after=after
                    )
                ],
            )
        action.step = f"restoring/{polls}"
        action.state = ActionState.PENDING
        action.attempts = max(0, action.attempts - 1)
        action.due_at = now + delay
        action.updated_at = now
        action.lease_owner = None
        action.lease_until = None


def add_retries(
    factory: sessionmaker[Session], action_id: str, retries: int
) -> tuple[str, str, int, int]:
    """Add one execution's storage retries to the action; its (kind, state, attempts,
    retries) after."""
    with session_scope(factory) as session:
        if retries:
            session.execute(
                update(Action)
                .where(Action.id == action_id)
                .values(retries=Action.retries + retries)
            )
        kind, state, attempts, total = session.execute(
            select(Action.kind, Action.state, Action.attempts, Action.retries).where(
                Action.id == action_id
            )
        ).one()
    return kind, state, attempts, total
