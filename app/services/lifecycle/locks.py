"""Checkpoints a provider will not let go of yet: Object Lock retention or a legal hold.

A delete the provider refuses for a lock fails once, with the date, and is not planned
again before that date: the plan lists the checkpoint under `skipped` instead of making
an action a worker would fail again and again. A legal hold has no date; it is looked at
again after LEGAL_HOLD_RECHECK. Placements the service makes on a tier with `object_lock`
lock the checkpoint from the start, for the tier's `retain`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Checkpoint
from app.db.session import session_scope
from app.domain.duration import format_instant
from app.domain.plan import PlannedAction, Skipped
from app.domain.states import ActionKind, CheckpointState
from app.services.lifecycle.snapshot import restrict
from app.storage.base import ObjectLocked

LEGAL_HOLD_RECHECK = timedelta(days=1)

Lock = tuple[datetime, str]  # until, why


def record_refusal(
    factory: sessionmaker[Session], checkpoint_id: str, error: ObjectLocked, now: datetime
) -> None:
    """Remember the lock a delete met, so that no plan asks for it again before it ends."""
    if error.legal_hold:
        until, why = now + LEGAL_HOLD_RECHECK, "under a legal hold"
    else:
        assert error.retain_until is not None
        until = error.retain_until
        why = f"retained by Object Lock until {format_instant(until)}"
    with session_scope(factory) as session:
        lock(session, checkpoint_id, until, why)


def lock(session: Session, checkpoint_id: str, until: datetime, why: str) -> None:
    checkpoint = session.get(Checkpoint, checkpoint_id)
    if checkpoint is None:
        return
    if checkpoint.locked_until is None or checkpoint.locked_until < until:
        checkpoint.locked_until = until
        checkpoint.lock_reason = why


def current_locks(
    session: Session,
    now: datetime,
    *,
    project: str | None = None,
    run_id: str | None = None,
    projects: Collection[str] | None = None,
    run_ids: Collection[str] | None = None,
) -> tuple[dict[str, Lock], list[Skipped]]:
    """Checkpoints of the scope locked at `now`, with until when and why; and the trashed
    ones among them as the plan lists them: their purge waits for the date."""
    stmt = restrict(
        select(
            Checkpoint.id, Checkpoint.state, Checkpoint.locked_until, Checkpoint.lock_reason
        ).where(Checkpoint.locked_until > now),
        project,
        run_id,
        projects,
        run_ids,
    )
    locks: dict[str, Lock] = {}
    waiting: list[Skipped] = []
    for checkpoint_id, state, until, why in session.execute(stmt):
        if until is None:
            continue
        until = until if until.tzinfo is not None else until.replace(tzinfo=UTC)
        locks[checkpoint_id] = (until, why or "locked by the provider")
        if state == CheckpointState.TRASHED:
            waiting.append(
                Skipped(
                    checkpoint_id,
                    "trash",
                    f"purge waits: the provider keeps it ({why}); tried again after "
                    f"{format_instant(until)}",
                )
            )
    return locks, waiting


def hold_back_locked(
    actions: list[PlannedAction], locks: Mapping[str, Lock]
) -> tuple[list[PlannedAction], list[Skipped]]:
    """The actions to plan now, and the deletes and moves of locked checkpoints, skipped
    until their lock ends (a copy leaves the source in place: it goes ahead)."""
    keep: list[PlannedAction] = []
    skipped: list[Skipped] = []
    for a in actions:
        locked = locks.get(a.checkpoint_id)
        if locked is None or a.kind == ActionKind.COPY:
            keep.append(a)
            continue
        until, why = locked
        skipped.append(
            Skipped(
                a.checkpoint_id,
                a.rule,
                f"{a.kind} skipped: the provider keeps it ({why}); planned again after "
                f"{format_instant(until)}",
            )
        )
    return keep, skipped
