"""Use cases for checkpoints: idempotent registration, pins, listing (commit, keepalive and
abort of a reservation: app.services.catalog.reservations)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from app.db.models import Checkpoint, Location
from app.db.pagination import BadCursor, decode_cursor, encode_cursor
from app.domain.errors import Conflict, Invalid
from app.domain.ids import new_id
from app.domain.states import CheckpointState
from app.domain.tier import Located, Tier, locate
from app.services.catalog import audit
from app.services.catalog.lookup import get_checkpoint
from app.services.catalog.manifest import (
    Manifest,
    check_supplied,
    list_manifest,
    normalise,
    same_files,
    total_size,
)
from app.services.catalog.overlap import refuse_overlap
from app.services.catalog.registration import insert_checkpoint
from app.services.catalog.reservations import apply_commit, lock_reservation, renew_reservation
from app.services.catalog.runs import get_run
from app.storage.registry import StorageRegistry

MAX_STEP = 2**63 - 1  # steps are BIGINT
DEFAULT_RESERVATION_TTL = timedelta(minutes=30)  # CKPT_RESERVATION_TTL


@dataclass(frozen=True, slots=True)
class Registration:
    step: int
    klass: str
    uri: str
    files: list[dict[str, Any]] | None
    size_bytes: int | None
    metrics: dict[str, float]
    labels: dict[str, str]
    created_at: datetime | None
    committed: bool


def _by_step(session: Session, run_id: str, step: int) -> Checkpoint | None:
    return session.execute(
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id, Checkpoint.step == step)
        .options(selectinload(Checkpoint.locations))
    ).scalar_one_or_none()


class AbortedStep(Conflict):
    """The step's reservation was aborted (its save failed, or its job died and the
    scheduler gave it up). Answering 200 would tell a save of that step that its bytes are
    catalogued while the purge is on its way to remove them; the save may instead take the
    reservation back (app.services.lifecycle.resave)."""

    def __init__(self, existing: Checkpoint) -> None:
        super().__init__(
            f"step {existing.step} of this run was reserved and aborted (checkpoint "
            f"{existing.id} is {existing.state}); saving it again reserves it anew",
            field="step",
            checkpoint_id=existing.id,
        )
        self.checkpoint_id = existing.id


def _check_same_content(existing: Checkpoint, reg: Registration, uri: str, files: Any) -> None:
    aborted = existing.committed_at is None and existing.state in (
        CheckpointState.TRASHED,
        CheckpointState.DELETED,
    )
    problems = []
    if existing.klass != reg.klass:
        problems.append(f"class {existing.klass!r}")
    if existing.uri != uri:
        problems.append(f"uri {existing.uri!r}")
    if aborted and not problems:
        raise AbortedStep(existing)  # its manifest and size were never the save's to compare
    if not same_files(existing.files, files):
        problems.append("a different manifest")
    elif reg.size_bytes is not None and existing.files and existing.size_bytes != reg.size_bytes:
        problems.append(f"size_bytes {existing.size_bytes}")
    if problems:
        raise Conflict(
            f"step {existing.step} of this run is already registered with {', '.join(problems)}",
            field="step",
        )


def register_checkpoint(
    session: Session,
    *,
    tiers: list[Tier],
    storages: StorageRegistry,
    run_id: str,
    reg: Registration,
    actor: str,
    now: datetime,
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
) -> tuple[Checkpoint, bool]:
    """Register a checkpoint; returns it and whether it was created.

    Idempotent: the same step with the same content returns the existing checkpoint;
    different content raises Conflict. Concurrent identical calls leave one row. A run
    that does not exist is a NotFound whatever else is wrong with the registration.

    `committed: false` reserves the step (`writing`) until now + `reservation_ttl`; the
    same reservation again renews it, like a keepalive; a committed registration of a
    reserved step commits it. A step whose reservation was aborted is an AbortedStep
    (a Conflict) unless class or uri differ (a plain Conflict then).
    """
    try:
        return _register(
            session,
            tiers=tiers,
            storages=storages,
            run_id=run_id,
            reg=reg,
            actor=actor,
            now=now,
            reservation_ttl=reservation_ttl,
        )
    except (Invalid, Conflict):
        # Looked up only when the registration is refused: the insert itself finds a
        # missing run (its foreign key), so the hot path spends no query on it.
        get_run(session, run_id)
        raise


def _register(
    session: Session,
    *,
    tiers: list[Tier],
    storages: StorageRegistry,
    run_id: str,
    reg: Registration,
    actor: str,
    now: datetime,
    reservation_ttl: timedelta,
) -> tuple[Checkpoint, bool]:
    located = locate(reg.uri, tiers)
    reserved_until = None if reg.committed else now + reservation_ttl
    files = normalise(reg.files) if reg.files is not None else None
    single_file = False
    if files is None:
        get_run(session, run_id)  # before listing storage on its behalf
        existing = _by_step(session, run_id, reg.step)
        if existing is not None:
            _check_same_content(existing, reg, located.uri, None)
            return _settle_existing(
                session, existing, reg, located, None, storages, actor, now, reserved_until
            ), False
        if reg.committed:
            refuse_overlap(session, located.uri, run_id=run_id, step=reg.step)
            listed = list_manifest(located, storages)
            files, single_file = listed.files, listed.single_file
    elif reg.committed:
        single_file = check_supplied(located, files, storages)
    values, location = new_rows(
        run_id,
        reg,
        located,
        files,
        single_file,
        actor=actor,
        now=now,
        reserved_until=reserved_until,
    )
    if not insert_checkpoint(session, values, location):
        existing = _by_step(session, run_id, reg.step)
        assert existing is not None  # the conflicting row is committed, or we would have waited
        _check_same_content(existing, reg, located.uri, files)
        return _settle_existing(
            session, existing, reg, located, files, storages, actor, now, reserved_until
        ), False
    return written_checkpoint(values, location), True


def written_checkpoint(values: dict[str, Any], location: dict[str, Any]) -> Checkpoint:
    """The checkpoint as inserted: the answer, without a round trip to read it back."""
    checkpoint = Checkpoint(**values)
    checkpoint.locations = [Location(**location)]
    return checkpoint


Rows = tuple[dict[str, Any], dict[str, Any]]  # a new checkpoint's row and its location's


def new_rows(
    run_id: str,
    reg: Registration,
    located: Located,
    files: Manifest | None,
    single_file: bool,
    *,
    actor: str,
    now: datetime,
    reserved_until: datetime | None,
) -> Rows:
    """The rows a registration writes, as the insert takes them."""
    size = total_size(files, reg.size_bytes)
    values: dict[str, Any] = {
        "id": new_id("ckpt"),
        "run_id": run_id,
        "step": reg.step,
        "klass": reg.klass,
        "state": "active" if reg.committed else "writing",
        "uri": located.uri,
        "tier": located.tier.name,
        "size_bytes": size,
        "files": files,
        "metrics": reg.metrics,
        "labels": reg.labels,
        "pinned": False,
        "pin_reason": None,
        "single_file": single_file,
        "created_at": reg.created_at or now,
        "registered_at": now,
        "committed_at": now if reg.committed else None,
        "created_by": actor,
        "updated_by": actor,
        "reserved_until": reserved_until,
    }
    location = {
        "checkpoint_id": values["id"],
        "tier": located.tier.name,
        "uri": located.uri,
        "storage_class": located.tier.storage_class,
        "role": "primary",
    }
    return values, location


def supplied_rows(
    tiers: list[Tier],
    storages: StorageRegistry,
    run_id: str,
    reg: Registration,
    *,
    actor: str,
    now: datetime,
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
) -> Rows:
    """The rows of a registration that sent its manifest, checked as `register_checkpoint`
    checks them (its uri located, its manifest against the tier), before any query: what
    app.api.fast_registration inserts without a session. Raises Invalid."""
    assert reg.files is not None
    located = locate(reg.uri, tiers)
    files = normalise(reg.files)
    single_file = check_supplied(located, files, storages) if reg.committed else False
    reserved_until = None if reg.committed else now + reservation_ttl
    return new_rows(
        run_id,
        reg,
        located,
        files,
        single_file,
        actor=actor,
        now=now,
        reserved_until=reserved_until,
    )


def _settle_existing(
    session: Session,
    checkpoint: Checkpoint,
    reg: Registration,
    located: Any,
    files: Any,
    storages: StorageRegistry,
    actor: str,
    now: datetime,
    reserved_until: datetime | None,
) -> Checkpoint:
    """The same step again, with the same content: a committed re-registration of a reserved
    step commits it; a reservation again renews it (a restarted save reserves its step
    anew); anything else leaves the checkpoint as it is."""
    if checkpoint.state != CheckpointState.WRITING:
        return checkpoint
    lock_reservation(session, checkpoint)
    if reserved_until is not None:
        renew_reservation(session, checkpoint, reserved_until)
        return checkpoint
    if files is None:
        listed = list_manifest(located, storages)
        files, single_file = listed.files, listed.single_file
    else:
        single_file = check_supplied(located, files, storages)
    apply_commit(
        session,
        checkpoint,
        files=files,
        single_file=single_file,
        size_bytes=reg.size_bytes,
        metrics=None,
        actor=actor,
        now=now,
    )
    session.flush()
    return checkpoint


def list_checkpoints(
    session: Session,
    *,
    run_id: str,
    klass: str | None,
    state: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Checkpoint], str | None]:
    """A run's checkpoints, newest step first, every state unless filtered."""
    get_run(session, run_id)
    stmt = (
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.step.desc())
        .limit(limit + 1)
        .options(selectinload(Checkpoint.locations))
    )
    if klass is not None:
        stmt = stmt.where(Checkpoint.klass == klass)
    if state is not None:
        stmt = stmt.where(Checkpoint.state == state)
    if cursor is not None:
        (last_step,) = decode_cursor(cursor, int)
        if isinstance(last_step, bool) or not 0 <= last_step <= MAX_STEP:
            # a forged step the database cannot compare (bigint overflow, boolean)
            raise BadCursor("not a cursor this list handed out", field="cursor")
        stmt = stmt.where(Checkpoint.step < last_step)
    rows = list(session.execute(stmt).scalars())
    page = rows[:limit]
    return page, encode_cursor(page[-1].step) if len(rows) > limit else None


def set_pin(
    session: Session,
    *,
    checkpoint_id: str,
    reason: str | None,
    actor: str,
    now: datetime | None = None,
) -> Checkpoint:
    """Pin (reason given) or unpin (None). Idempotent: a repeat records no audit event (a
    new reason for a pinned checkpoint does)."""
    checkpoint = get_checkpoint(session, checkpoint_id)
    if reason is not None and checkpoint.state == CheckpointState.DELETED:
        raise Conflict("a deleted checkpoint has no bytes left to pin", field="checkpoint_id")
    was = {"pinned": checkpoint.pinned, "pin_reason": checkpoint.pin_reason}
    before, after = audit.diff(was, {"pinned": reason is not None, "pin_reason": reason})
    checkpoint.pinned = reason is not None
    checkpoint.pin_reason = reason
    checkpoint.updated_by = actor
    if after:
        event = "pinned" if reason is not None else "unpinned"
        audit.record_many(
            session,
            [
                audit.checkpoint_event(
                    checkpoint.id,
                    checkpoint.run_id,
                    event,
                    actor=actor,
                    at=now or datetime.now(UTC),
                    before=before,
                    after=after,
                )
            ],
        )
    session.flush()
    return checkpoint


def count_drifting(session: Session) -> int:
    """Checkpoints whose files the last reconciliation found missing or changed."""
    count = session.scalar(
        select(func.count()).select_from(Checkpoint).where(Checkpoint.health == "drift")
    )
    return int(count or 0)
