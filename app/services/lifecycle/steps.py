"""A transfer's phases, each recorded in the ledger before the next:

    (restore wait) -> copy -> verify -> switch catalog -> (move) remove source

Nothing at a source is removed before its copy is verified and catalogued, and a worker
killed anywhere leaves an action the next worker resumes from its `step`. Every storage
change and every step is followed by a crash point (tests/reliability reads this source).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.db.models import Action, Checkpoint, Location, Project, Run
from app.db.session import session_scope
from app.domain.duration import format_instant
from app.domain.states import ActionKind, ActionState, CheckpointState, LocationRole
from app.domain.tier import Tier, locate
from app.services.catalog import audit
from app.services.catalog.overlap import find_overlap
from app.services.lifecycle import ledger, locks
from app.services.lifecycle.billed import record_removed
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.placement import (
    files_base,
    placed_uri,
    refuse_if_overlapping,
    remove_location,
)
from app.storage.base import Storage, join_key
from app.storage.registry import StorageRegistry
from app.storage.transfer import VerificationFailed, change_class, copy_files, verify_files

log = logging.getLogger("app.worker")

PROGRESS_EVERY = timedelta(seconds=2)  # the lease is renewed, and bytes_done written, this often
RESTORE_POLL_MAX = timedelta(seconds=30)


@dataclass
class Context:
    """What a worker's steps share: the database, the tiers, the clock and its own name."""

    factory: sessionmaker[Session]
    tiers: list[Tier]
    storages: StorageRegistry
    owner: str
    clock: Callable[[], datetime]
    trash_retention: timedelta
    tiers_by_name: dict[str, Tier] = field(init=False)

    def __post_init__(self) -> None:
        self.tiers_by_name = {t.name: t for t in self.tiers}

    def storage(self, uri: str) -> tuple[Storage, str]:
        located = locate(uri, self.tiers)
        return self.storages.storage_for(located.tier), located.key


class Progress:
    """Bytes a running transfer has copied, added to from its copying threads."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.value += count


class Phases:
    """Seconds each phase of one transfer took, for its log line: where a slow move spends
    its time (copy, verify, switch, source removal), and what the benchmark reports."""

    def __init__(self) -> None:
        self.started = self._at = time.monotonic()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[f"{phase}_s"] = round(now - self._at, 3)
        self._at = now

    def log(self, action_id: str, kind: str) -> None:
        total = round(time.monotonic() - self.started, 3)
        log.info(
            "transfer phases",
            extra={"action_id": action_id, "kind": kind, "total_s": total, **self.seconds},
        )


def load_checkpoint(session: Session, checkpoint_id: str) -> Checkpoint:
    return session.execute(
        select(Checkpoint)
        .where(Checkpoint.id == checkpoint_id)
        .options(selectinload(Checkpoint.locations))
    ).scalar_one()


def checkpoint_event(
    ctx: Context,
    session: Session,
    action: Action,
    checkpoint: Checkpoint,
    event: str,
    *,
    before: dict[str, object],
    after: dict[str, object],
) -> None:
    """A catalog change made by executing `action`: as its actor, for its rule."""
    change = audit.checkpoint_event(
        checkpoint.id,
        checkpoint.run_id,
        event,
        actor=audit.action_actor(action),
        at=ctx.clock(),
        before=before,
        after=after,
        reason=action.rule,
    )
    audit.record_many(session, [change])


def transfer(ctx: Context, action_id: str) -> None:
    """move, copy and restore: (restore) -> copy -> verify -> switch -> (move) remove."""
    phases = Phases()
    with session_scope(ctx.factory) as session:
        action = session.get(Action, action_id)
        assert action is not None
        checkpoint = load_checkpoint(session, action.checkpoint_id)
        reason = _refuse_transfer(ctx, action, checkpoint)
        if reason is not None:
            done = reason == "already there"
            state = ActionState.DONE if done else ActionState.CANCELLED
            ledger.close(session, action, state, ctx.clock(), None if done else reason)
            return
        if action.dest_uri is None:
            planned_source, planned_dest = _endpoints(ctx, session, action, checkpoint)
            if planned_dest != planned_source:
                refuse_if_overlapping(session, planned_dest, checkpoint.id, "write a copy to")
            action.source_uri, action.dest_uri = planned_source, planned_dest
        kind, step = action.kind, action.step
        checkpoint_id, single_file = checkpoint.id, checkpoint.single_file
        source_uri, dest_uri = action.source_uri, action.dest_uri
        manifest = list(checkpoint.files or [])
        if step == "switched" and dest_uri not in {loc.uri for loc in checkpoint.locations}:
            # The record is ahead of the catalog: never remove a source the catalog still
            # lists on the record's word; verify the destination and switch again.
            step = "copied"
    crash_point("transfer.started")
    assert source_uri is not None and dest_uri is not None and action.to_tier is not None
    dest_tier = ctx.tiers_by_name[action.to_tier]
    source, source_uri_key = ctx.storage(source_uri)
    dest, dest_uri_key = ctx.storage(dest_uri)
    # the prefix the manifest's paths hang from (a single file's: its directory)
    source_key = files_base(source_uri_key, single_file)
    dest_key = files_base(dest_uri_key, single_file)
    in_place = source_uri == dest_uri  # two tiers on one bucket prefix: a class change
    streamed: dict[str, dict[str, str]] = {}
    if step is None or step.startswith("restoring"):
        if not in_place and _awaiting_restore(ctx, action_id, step, source, source_key, manifest):
            return
        with _lease_kept(ctx, action_id) as progress:
            if in_place:
                change_class(dest, dest_key, manifest, dest_tier.storage_class or "STANDARD")
                crash_point("transfer.class_changed")
            else:
                # a crashed attempt's unfinished uploads (a single file's: its own)
                dest.abort_uploads(dest_uri_key if single_file else dest_key)
                crash_point("transfer.uploads_aborted")
                try:
                    streamed = copy_files(
                        source,
                        source_key,
                        dest,
                        dest_key,
                        manifest,
                        storage_class=dest_tier.storage_class,
                        on_file=lambda: crash_point("transfer.file_copied"),
                        on_bytes=progress.add,
                    ).digests
                except VerificationFailed:
                    discard(ctx, dest, dest_uri_key, dest_uri, checkpoint_id)
                    raise
        ledger.set_step(ctx.factory, action_id, "copied", ctx.clock())
        crash_point("transfer.copied")
        step = "copied"
        phases.lap("copy")
    if step == "copied":
        problems = verify_files(
            dest, dest_key, manifest, streamed=streamed, source=source, source_prefix=source_key
        )
        crash_point("transfer.destination_checked")
        if problems:
            if not in_place:
                discard(ctx, dest, dest_uri_key, dest_uri, checkpoint_id)
            raise VerificationFailed(
                f"{dest_uri} does not match the manifest: " + "; ".join(problems[:5])
            )
        ledger.set_step(ctx.factory, action_id, "verified", ctx.clock())
        crash_point("transfer.verified")
        step = "verified"
        phases.lap("verify")
    if step == "verified":
        switch(ctx, action_id, dest_uri)
        crash_point("transfer.switched")
        step = "switched"
        phases.lap("switch")
    if kind == ActionKind.MOVE and not in_place:
        with session_scope(ctx.factory) as session:
            refuse_if_overlapping(session, source_uri, checkpoint_id, "remove the source")
        remove_location(source, source_uri_key, single_file)
        crash_point("transfer.source_removed")
        source_tier = locate(source_uri, ctx.tiers).tier
        if source_tier.provider.billed_after_delete != timedelta(0):
            with session_scope(ctx.factory) as session:
                checkpoint = load_checkpoint(session, checkpoint_id)
                record_removed(session, action_id, checkpoint, source_tier, ctx.clock())
        phases.lap("remove_source")
    ledger.finish(ctx.factory, action_id, ActionState.DONE, ctx.clock())
    crash_point("transfer.done")
    phases.log(action_id, kind)


def _awaiting_restore(
    ctx: Context,
    action_id: str,
    step: str | None,
    source: Storage,
    source_key: str,
    manifest: list[dict[str, object]],
) -> bool:
    """Archived source objects are restored first; True while that is in progress.

    The action goes back to `pending`, polled with backoff and at least every 30 s;
    waiting is not a failed attempt."""
    keys = [join_key(source_key, str(entry["path"])) for entry in manifest]
    states = {key: source.restore_state(key) for key in keys}
    archived = [key for key, state in states.items() if state == "archived"]
    for key in archived:
        source.request_restore(key)
        crash_point("transfer.restore_requested")
    if not archived and all(state == "readable" for state in states.values()):
        return False
    polls = int(step.split("/")[1]) + 1 if step and "/" in step else 0
    delay = min(RESTORE_POLL_MAX, timedelta(seconds=2**polls))
    ledger.wait_for_restore(ctx.factory, action_id, polls, ctx.clock(), delay)
    crash_point("transfer.restore_pending")
    waiting = sum(1 for state in states.values() if state != "readable")
    log.info(
        "waiting for archive restore",
        extra={"action_id": action_id, "objects": waiting, "poll_in_s": delay.seconds},
    )
    return True


@contextmanager
def _lease_kept(ctx: Context, action_id: str) -> Iterator[Progress]:
    """Renew the lease while a long copy runs, so no other worker takes the action, and
    write how far it got (`bytes_done`) every PROGRESS_EVERY."""
    stop = threading.Event()
    progress = Progress()

    def renew() -> None:
        while not stop.wait(PROGRESS_EVERY.total_seconds()):
            ledger.renew(ctx.factory, action_id, ctx.owner, ctx.clock(), progress.value)

    thread = threading.Thread(target=renew, name=f"lease-{action_id}", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()


def discard(ctx: Context, dest: Storage, dest_key: str, dest_uri: str, checkpoint_id: str) -> None:
    """Remove a bad or partial copy: the manifest's files at `dest_uri`, nothing else there,
    and nothing at all when the catalog lists that place or another checkpoint owns bytes
    there or around it (then it is not ours to remove)."""
    with session_scope(ctx.factory) as session:
        listed = session.execute(select(Location.id).where(Location.uri == dest_uri)).first()
        other = find_overlap(session, dest_uri, exclude_checkpoint=checkpoint_id)
        files, single_file = session.execute(
            select(Checkpoint.files, Checkpoint.single_file).where(Checkpoint.id == checkpoint_id)
        ).one()
    if listed is None and other is None:
        base = files_base(dest_key, single_file)
        dest.delete_keys(join_key(base, str(entry["path"])) for entry in files or [])
        crash_point("transfer.copy_discarded")


def _refuse_transfer(ctx: Context, action: Action, checkpoint: Checkpoint) -> str | None:
    if checkpoint.state != CheckpointState.ACTIVE:
        return f"checkpoint is {checkpoint.state}"
    if action.to_tier not in ctx.tiers_by_name:
        return f"unknown tier {action.to_tier!r}"
    if action.step is not None:
        return None  # resuming: the catalog may already have switched
    if action.kind == ActionKind.MOVE and checkpoint.pinned:
        return "checkpoint is pinned"
    held = {loc.tier for loc in checkpoint.locations}
    if action.kind != ActionKind.MOVE and action.to_tier in held:
        return "already there"
    primary = next((loc for loc in checkpoint.locations if loc.role == LocationRole.PRIMARY), None)
    if action.kind == ActionKind.MOVE and primary is not None and primary.tier == action.to_tier:
        return "already there"
    return None


def _endpoints(
    ctx: Context, session: Session, action: Action, checkpoint: Checkpoint
) -> tuple[str, str]:
    primary = next(loc for loc in checkpoint.locations if loc.role == LocationRole.PRIMARY)
    project, run_name = session.execute(
        select(Project.name, Run.name)
        .join(Run, Run.project_id == Project.id)
        .where(Run.id == checkpoint.run_id)
    ).one()
    tier = ctx.tiers_by_name[action.to_tier or ""]
    source_tier = ctx.tiers_by_name.get(primary.tier)
    if source_tier is not None and source_tier.url == tier.url:
        return primary.uri, primary.uri  # one bucket prefix, two classes: in place
    name = primary.uri.rsplit("/", 1)[-1] if checkpoint.single_file else None
    return primary.uri, placed_uri(tier, project, run_name, checkpoint.step, name)


def switch(ctx: Context, action_id: str, dest_uri: str) -> None:
    """Catalog the verified copy, in one transaction with the step."""
    with session_scope(ctx.factory) as session:
        action = session.get(Action, action_id)
        assert action is not None and action.to_tier is not None
        tier = ctx.tiers_by_name[action.to_tier]
        checkpoint = load_checkpoint(session, action.checkpoint_id)
        was = audit.placement(checkpoint.locations)
        placed = list(checkpoint.locations)
        on_target = next((loc for loc in checkpoint.locations if loc.tier == tier.name), None)
        if action.kind == ActionKind.MOVE:
            primary = next(
                (loc for loc in checkpoint.locations if loc.role == LocationRole.PRIMARY), None
            )
            if on_target is not None and on_target is not primary:
                session.delete(on_target)
                session.flush()
                placed.remove(on_target)
            if primary is not None:
                primary.tier, primary.uri = tier.name, dest_uri
                primary.storage_class = tier.storage_class
                # a checkpoint's uri and tier are its primary's, always
                checkpoint.uri, checkpoint.tier = dest_uri, tier.name
        elif on_target is None:
            replica = Location(
                checkpoint_id=checkpoint.id,
                tier=tier.name,
                uri=dest_uri,
                storage_class=tier.storage_class,
                role=LocationRole.REPLICA,
            )
            session.add(replica)
            placed.append(replica)
        before, after = audit.diff(was, audit.placement(placed))
        if after:  # not when a resumed action had switched already
            event = {"move": "moved", "copy": "copied"}.get(action.kind, "restored")
            checkpoint_event(ctx, session, action, checkpoint, event, before=before, after=after)
        lock = tier.provider.object_lock
        if lock is not None and after:  # written locked (S3Calls._placement): keep it so
            until = ctx.clock() + lock.retain
            why = f"written under Object Lock ({lock.mode}) on {tier.name}"
            locks.lock(session, checkpoint.id, until, f"{why} until {format_instant(until)}")
        checkpoint.updated_by = action.actor
        ledger.mark_step(action, "switched", ctx.clock())
