"""Reservations: the life of an asynchronous save (DESIGN section 12).

A `writing` checkpoint is a reservation that lives until its `reserved_until`; the job
keeps it alive, commits it (`active`) or aborts it (`trashed`: its partial bytes are purged
after the trash period, like any delete). One neither committed nor kept alive in time is
abandoned, and the scheduler aborts it. Every change of state locks the checkpoint's row
first, so a commit and an abort of the same reservation never both take effect.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.dialect import skip_locked
from app.db.models import Checkpoint
from app.domain.access import SCHEDULER_ACTOR
from app.domain.errors import Conflict
from app.domain.states import CheckpointState
from app.domain.tier import Tier, locate
from app.services.catalog import audit
from app.services.catalog.lookup import get_checkpoint
from app.services.catalog.manifest import (
    check_supplied,
    list_manifest,
    normalise,
    same_files,
    total_size,
)
from app.services.catalog.run_totals import add_active
from app.storage.registry import StorageRegistry

ABANDONED = "abandoned"  # the reason the scheduler gives when it aborts a reservation


def renew_reservation(session: Session, checkpoint: Checkpoint, until: datetime) -> None:
    """Move a `writing` checkpoint's `reserved_until` to `until` (never back)."""
    if checkpoint.reserved_until is None or checkpoint.reserved_until < until:
        checkpoint.reserved_until = until
    session.flush()


def lock_reservation(session: Session, checkpoint: Checkpoint) -> None:
    """Lock a reservation's row before changing it, and read its state again: the scheduler
    may have aborted it since it was read (Conflict then)."""
    session.execute(
        select(Checkpoint.id).where(Checkpoint.id == checkpoint.id).with_for_update()
    ).all()
    session.refresh(checkpoint, attribute_names=["state", "reserved_until", "trashed_at"])
    if checkpoint.state != CheckpointState.WRITING:
        raise Conflict(f"checkpoint is {checkpoint.state}, not writing", field="state")


def apply_commit(
    session: Session,
    checkpoint: Checkpoint,
    *,
    files: list[dict[str, Any]],
    single_file: bool,
    size_bytes: int | None,
    metrics: dict[str, float] | None,
    actor: str,
    now: datetime,
) -> None:
    """A `writing` checkpoint becomes `active` with its manifest and size: its run's active
    totals grow and its evaluation is asked for, audited as `committed`. The caller holds
    the row (get_checkpoint(for_update=True) or lock_reservation) and has checked the state."""
    was = {
        "state": checkpoint.state,
        "size_bytes": checkpoint.size_bytes,
        "reserved_until": checkpoint.reserved_until,
    }
    checkpoint.files = files
    checkpoint.single_file = single_file
    checkpoint.size_bytes = total_size(files, size_bytes)
    if metrics is not None:
        checkpoint.metrics = {**checkpoint.metrics, **metrics}
    checkpoint.state = "active"
    checkpoint.committed_at = now
    checkpoint.reserved_until = None
    checkpoint.updated_by = actor
    committed = {"state": "active", "size_bytes": checkpoint.size_bytes, "reserved_until": None}
    audit.record_many(
        session,
        [
            audit.checkpoint_event(
                checkpoint.id,
                checkpoint.run_id,
                "committed",
                actor=actor,
                at=now,
                before=was,
                after=committed,
            )
        ],
    )
    add_active(
        session,
        checkpoint.run_id,
        checkpoints=1,
        size=checkpoint.size_bytes,
        request_evaluation_at=now,
    )


def commit_checkpoint(
    session: Session,
    *,
    tiers: list[Tier],
    storages: StorageRegistry,
    checkpoint_id: str,
    files: list[dict[str, Any]] | None,
    size_bytes: int | None,
    metrics: dict[str, float] | None,
    actor: str,
    now: datetime,
) -> Checkpoint:
    """Turn a `writing` checkpoint `active`. Repeating the commit of an active one is a no-op
    when the manifest agrees; committing a trashed or deleted one is a Conflict."""
    checkpoint = get_checkpoint(session, checkpoint_id, for_update=True)
    manifest = normalise(files) if files is not None else None
    if checkpoint.state == CheckpointState.ACTIVE:
        if not same_files(checkpoint.files, manifest):
            raise Conflict(
                "checkpoint is already committed with a different manifest", field="files"
            )
        return checkpoint
    if checkpoint.state != CheckpointState.WRITING:
        raise Conflict(f"checkpoint is {checkpoint.state}, not writing", field="state")
    located = locate(checkpoint.uri, tiers)
    if manifest is None:
        listed = list_manifest(located, storages)
        manifest, single_file = listed.files, listed.single_file
    else:
        single_file = check_supplied(located, manifest, storages)
    apply_commit(
        session,
        checkpoint,
        files=manifest,
        single_file=single_file,
        size_bytes=size_bytes,
        metrics=metrics,
        actor=actor,
        now=now,
    )
    session.flush()
    return checkpoint


def _not_writing(checkpoint: Checkpoint, doing: str) -> Conflict:
    return Conflict(
        f"checkpoint is {checkpoint.state}, not writing: only a reservation can be {doing}",
        field="state",
    )


def keep_alive(
    session: Session, *, checkpoint_id: str, ttl: timedelta, now: datetime
) -> Checkpoint:
    """Move a `writing` checkpoint's `reserved_until` to now + `ttl`; any other state is a
    Conflict. A reservation past its time that the scheduler has not aborted yet is still
    alive. Not audited: it changes no state, only how long the reservation lasts (as a
    worker renewing its lease on an action)."""
    checkpoint = get_checkpoint(session, checkpoint_id, for_update=True)
    if checkpoint.state != CheckpointState.WRITING:
        raise _not_writing(checkpoint, "kept alive")
    renew_reservation(session, checkpoint, now + ttl)
    return checkpoint


def abort_reservation(
    session: Session, *, checkpoint_id: str, reason: str | None, actor: str, now: datetime
) -> Checkpoint:
    """A `writing` checkpoint becomes `trashed` (the save failed); any other state, or a
    pinned reservation (a person said keep it), is a Conflict."""
    checkpoint = get_checkpoint(session, checkpoint_id, for_update=True)
    if checkpoint.state != CheckpointState.WRITING:
        raise _not_writing(checkpoint, "aborted")
    if checkpoint.pinned:
        raise Conflict("checkpoint is pinned: unpin it before aborting it", field="pinned")
    audit.record_many(session, [_abort(checkpoint, reason, actor, now)])
    session.flush()
    return checkpoint


def abort_abandoned(session: Session, *, now: datetime, limit: int = 1000) -> list[str]:
    """Abort every reservation whose `reserved_until` has passed (actor `system:scheduler`,
    reason `abandoned`), audited in the same transaction; returns their ids. Pinned ones are
    left alone. Rows a commit or keepalive holds right now are passed over (they are alive);
    idempotent, and safe to run in several schedulers at once."""
    stmt = (
        select(Checkpoint)
        .where(
            Checkpoint.state == CheckpointState.WRITING,
            Checkpoint.reserved_until < now,
            Checkpoint.pinned.is_(False),
        )
        .order_by(Checkpoint.reserved_until)
        .limit(limit)
    )
    rows = list(session.execute(skip_locked(session, stmt, of=Checkpoint)).scalars())
    audit.record_many(session, [_abort(c, ABANDONED, SCHEDULER_ACTOR, now) for c in rows])
    session.flush()
    return [c.id for c in rows]


def _abort(checkpoint: Checkpoint, reason: str | None, actor: str, now: datetime) -> dict[str, Any]:
    """To the trash, where the purge finds it after the trash period; the audit event."""
    before = {"state": checkpoint.state, "reserved_until": checkpoint.reserved_until}
    checkpoint.state = CheckpointState.TRASHED
    checkpoint.trashed_at = now
    checkpoint.reserved_until = None
    checkpoint.updated_by = actor
    return audit.checkpoint_event(
        checkpoint.id,
        checkpoint.run_id,
        "aborted",
        actor=actor,
        at=now,
        before=before,
        after={"state": "trashed", "reserved_until": None},
        reason=reason,
    )
