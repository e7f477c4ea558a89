"""The trash: a delete moves a checkpoint there, its bytes stay for the retention period,
then a purge removes them from every location."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app import metrics
from app.db.models import Action, Checkpoint
from app.db.session import session_scope
from app.domain.states import ActionState, CheckpointState
from app.services.catalog import audit
from app.services.catalog.run_totals import add_active
from app.services.lifecycle import ledger
from app.services.lifecycle.billed import record_removed
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.ledger import add_action, failed_purges, open_action, purge_action
from app.services.lifecycle.placement import refuse_if_overlapping, remove_location
from app.services.lifecycle.plan_ledger import replan_after
from app.services.lifecycle.steps import Context, checkpoint_event, load_checkpoint


def enqueue_due_purges(
    session: Session, *, retention: timedelta, now: datetime, limit: int = 1000
) -> int:
    """Create a purge for every trashed checkpoint whose trash period is over and that no
    provider lock keeps (locks.py: not before the lock's date). A purge that
    failed (refused because another checkpoint owns bytes there, say) is tried again only
    after a pause that doubles with each failure, not every 30 s; one that failed for a lock
    is tried again as its date passes."""
    cutoff = now - retention
    rows = session.execute(
        select(Checkpoint.id, Checkpoint.run_id, Checkpoint.size_bytes, Checkpoint.locked_until)
        .where(Checkpoint.state == CheckpointState.TRASHED, Checkpoint.trashed_at <= cutoff)
        .where(or_(Checkpoint.locked_until.is_(None), Checkpoint.locked_until <= now))
        .limit(limit)
    ).all()
    failed = failed_purges(session, [row[0] for row in rows])
    created = 0
    for checkpoint_id, run_id, size, locked_until in rows:
        if open_action(session, checkpoint_id, "purge", None) is not None:
            continue
        failures = failed.get(checkpoint_id)
        lock_ended = (
            locked_until is not None and failures is not None and failures[1] < _utc(locked_until)
        )
        if (
            failures is not None
            and not lock_ended
            and failures[1] + replan_after(failures[0]) > now
        ):
            continue
        add_action(session, purge_action(session, checkpoint_id, run_id, size, now), now)
        created += 1
    session.flush()
    return created


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes from a Core row; the catalog stores UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def delete(ctx: Context, action_id: str) -> None:
    """To the trash: the bytes stay until the purge."""
    with session_scope(ctx.factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        checkpoint = load_checkpoint(session, action.checkpoint_id)
        if checkpoint.pinned:
            ledger.close(
                session, action, ActionState.CANCELLED, ctx.clock(), "checkpoint is pinned"
            )
            return
        if checkpoint.state == CheckpointState.ACTIVE:
            add_active(session, checkpoint.run_id, checkpoints=-1, size=-checkpoint.size_bytes)
        if checkpoint.state not in (CheckpointState.TRASHED, CheckpointState.DELETED):
            checkpoint_event(
                ctx,
                session,
                action,
                checkpoint,
                "trashed",
                before={"state": checkpoint.state},
                after={"state": "trashed"},
            )
            checkpoint.state = CheckpointState.TRASHED
            checkpoint.trashed_at = ctx.clock()
            checkpoint.reserved_until = None  # a reservation deleted by hand ends too
            checkpoint.updated_by = action.actor
        ledger.close(session, action, ActionState.DONE, ctx.clock())
        session.flush()
        if checkpoint.state == CheckpointState.TRASHED and ctx.trash_retention <= timedelta(0):
            size = checkpoint.size_bytes
            now = ctx.clock()
            purge = purge_action(session, checkpoint.id, checkpoint.run_id, size, now)
            add_action(session, purge, now)
    crash_point("delete.trashed")


def purge(ctx: Context, action_id: str) -> None:
    """Remove the bytes from every location, then mark the checkpoint deleted."""
    with session_scope(ctx.factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        checkpoint = load_checkpoint(session, action.checkpoint_id)
        if checkpoint.state == CheckpointState.DELETED:
            ledger.close(session, action, ActionState.DONE, ctx.clock())
            return
        if checkpoint.state != CheckpointState.TRASHED:
            why = f"checkpoint is {checkpoint.state}"
            ledger.close(session, action, ActionState.CANCELLED, ctx.clock(), why)
            return
        uris = [loc.uri for loc in checkpoint.locations]
        single_file = checkpoint.single_file
        # an aborted reservation: its save never said what it wrote, or whether the uri is
        # a prefix or one object
        reservation = checkpoint.committed_at is None
        for uri in uris:  # all of them before any byte goes: a purge is whole or nothing
            refuse_if_overlapping(session, uri, checkpoint.id, "purge")
    crash_point("purge.checked")
    for uri in uris:
        storage, key = ctx.storage(uri)
        remove_location(storage, key, single_file, committed=not reservation)
        crash_point("purge.location_removed")
    with session_scope(ctx.factory) as session:
        checkpoint = load_checkpoint(session, action.checkpoint_id)
        metrics.bytes_purged(checkpoint.size_bytes, [loc.tier for loc in checkpoint.locations])
        finished = session.get(Action, action_id)
        assert finished is not None
        now = ctx.clock()
        checkpoint_event(
            ctx,
            session,
            finished,
            checkpoint,
            "purged",
            before={"state": checkpoint.state, **audit.placement(checkpoint.locations)},
            after={"state": "deleted", "tier": None, "locations": []},
        )
        for loc in list(checkpoint.locations):
            record_removed(session, action_id, checkpoint, ctx.tiers_by_name.get(loc.tier), now)
            session.delete(loc)
        checkpoint.state = CheckpointState.DELETED
        checkpoint.tier = None  # no primary is left
        checkpoint.updated_by = action.actor
        ledger.close(session, finished, ActionState.DONE, now)
    crash_point("purge.done")
