"""Workers execute ledger actions in idempotent phases, each recorded before the next:

    copy -> verify -> switch catalog -> remove source

Nothing at a source is removed before its copy is verified and catalogued, and a
worker killed anywhere leaves an action the next worker resumes from its `step`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.orm import Session, aliased, selectinload, sessionmaker

from app import metrics
from app.db.models import Action, Checkpoint, Location, Project, Run
from app.db.session import session_scope
from app.domain.tier import Tier, locate
from app.services.catalog import audit
from app.services.catalog.overlap import find_overlap
from app.services.catalog.run_totals import count_active
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.ledger import add_action, purge_action
from app.services.lifecycle.placement import (
    files_base,
    placed_uri,
    refuse_if_overlapping,
    remove_location,
)
from app.storage.base import Storage, StorageError, is_permanent, join_key
from app.storage.registry import storage_for
from app.storage.retry import counting_retries
from app.storage.transfer import VerificationFailed, change_class, copy_files, verify_files

log = logging.getLogger("app.worker")

LEASE = timedelta(seconds=30)
PROGRESS_EVERY = timedelta(seconds=2)  # the lease is renewed, and bytes_done written, this often
MAX_ATTEMPTS = 5
RESTORE_POLL_MAX = timedelta(seconds=30)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Progress:
    """Bytes a running transfer has copied, added to from its copying threads."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.value += count


# -- storage retries per action: kept in the ledger and counted in the metrics --------------


def _tallied(execute: Callable[[Executor, str], None]) -> Callable[[Executor, str], None]:
    """Count the transient storage retries made while one action executes (its adapters'
    thread pools included: they run in the caller's context) and record them."""

    @functools.wraps(execute)
    def run(self: Executor, action_id: str) -> None:
        with counting_retries() as tally:
            execute(self, action_id)
        record_retries(self.factory, action_id, tally.count)

    return run


def record_retries(factory: sessionmaker[Session], action_id: str, retries: int) -> None:
    """After one execution of an action: its storage retries are added to its ledger row,
    and they and its outcome go to the metrics and to a log line (`action finished` once it
    is done, failed or cancelled)."""
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
    metrics.action_executed(kind, state, retries)
    finished = state in metrics.FINAL_STATES
    log.info(
        "action finished" if finished else "action attempt ended",
        extra={
            "action_id": action_id,
            "kind": kind,
            "state": state,
            "attempts": attempts,
            "retries": total,
        },
    )


class Executor:
    """Claims and executes actions. Safe to run in many processes on one PostgreSQL."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        tiers: list[Tier],
        *,
        trash_retention: timedelta,
        owner: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.factory = factory
        self.tiers = tiers
        self.tiers_by_name = {t.name: t for t in tiers}
        self.trash_retention = trash_retention
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}"
        self.clock = clock

    # -- claiming ---------------------------------------------------------------------------

    def claim(self) -> str | None:
        """Take one due action (or one whose lease expired); None when there is none."""
        with session_scope(self.factory) as session:
            now = self.clock()
            other = aliased(Action)
            busy = exists().where(
                other.checkpoint_id == Action.checkpoint_id,
                other.id != Action.id,
                other.state == "running",
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
                        and_(Action.state == "pending", Action.due_at <= now),
                        and_(Action.state == "running", Action.lease_until < now),
                    ),
                    ~busy,
                )
                .order_by(Action.due_at)
                .limit(1)
            )
            if session.get_bind().dialect.name == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True, of=Action)
            row = session.execute(stmt).first()
            if row is None:
                return None
            claimed = session.execute(
                update(Action)
                .where(Action.id == row[0], Action.updated_at == row[1])
                .values(
                    state="running",
                    lease_owner=self.owner,
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
                    after={
                        "state": "running",
                        "attempts": row.attempts + 1,
                        "lease_owner": self.owner,
                    },
                    reason=row.rule,
                )
            return str(row.id)

    def run_once(self) -> bool:
        action_id = self.claim()
        if action_id is None:
            return False
        crash_point("worker.claimed")
        self.execute(action_id)
        return True

    def drain(self, limit: int = 10_000) -> int:
        """Execute due actions until none is left (tests and `ckpt worker --once`)."""
        count = 0
        while count < limit and self.run_once():
            count += 1
        return count

    # -- execution --------------------------------------------------------------------------

    @_tallied
    def execute(self, action_id: str) -> None:
        try:
            kind = self._load(action_id).kind
            {"delete": self._delete, "purge": self._purge}.get(kind, self._transfer)(action_id)
        except VerificationFailed as error:
            self._fail(action_id, f"verification failed: {error}")
        except (StorageError, OSError) as error:
            reason = f"{type(error).__name__}: {error}"
            if is_permanent(error):  # waiting will not heal it: fail now, not after 5 tries
                self._remove_partial_copy(action_id)
                self._fail(action_id, reason)
                return
            if self._load(action_id).attempts >= MAX_ATTEMPTS:
                self._remove_partial_copy(action_id)
            self._retry(action_id, reason)
            crash_point("action.retry_scheduled")

    def _fail(self, action_id: str, error: str) -> None:
        """End the action `failed` with its reason. A partial copy is removed before (a
        worker killed in between leaves an action the next one runs again, never a copy
        nobody owns)."""
        self._finish(action_id, "failed", error=error)
        crash_point("action.failed")
        log.warning("action failed", extra={"action_id": action_id, "error": error})

    def _remove_partial_copy(self, action_id: str) -> None:
        """A transfer about to fail for good leaves no partial copy at its destination
        (the files copied before the error); a place the catalog lists is never touched."""
        action = self._load(action_id)
        dest_uri = action.dest_uri
        if dest_uri is None or dest_uri == action.source_uri:
            return
        try:
            dest, dest_key = self._storage(dest_uri)
            self._discard(dest, dest_key, dest_uri, action.checkpoint_id)
        except (StorageError, OSError) as error:  # left for reconcile to report as an orphan
            log.warning(
                "could not remove a failed transfer's partial copy",
                extra={"action_id": action_id, "error": f"{type(error).__name__}: {error}"},
            )

    def _load(self, action_id: str) -> Action:
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            return action

    def _close(
        self, session: Session, action: Action, state: str, error: str | None = None
    ) -> None:
        """End the action `done`, `failed` or `cancelled`, and audit it as that state."""
        now = self.clock()
        after: dict[str, object] = {"state": state}
        if error is not None:
            after["error"] = error
        audit.record_many(
            session,
            [
                audit.action_event(
                    action, state, at=now, before={"state": action.state}, after=after
                )
            ],
        )
        action.state = state
        action.error = error
        if state == "done":
            action.bytes_done = action.bytes
        action.finished_at = now
        action.updated_at = now
        action.lease_owner = None
        action.lease_until = None

    def _finish(self, action_id: str, state: str, *, error: str | None = None) -> None:
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            self._close(session, action, state, error)

    def _retry(self, action_id: str, error: str) -> None:
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            now = self.clock()
            was = action.state
            action.error = error
            action.updated_at = now
            action.lease_owner = None
            action.lease_until = None
            if action.attempts >= MAX_ATTEMPTS:
                action.state = "failed"
                action.finished_at = now
                after: dict[str, object] = {"state": "failed", "error": error}
            else:
                action.state = "pending"
                action.due_at = now + timedelta(seconds=min(2**action.attempts, 300))
                after = {"state": "pending", "error": error, "due_at": action.due_at}
            event = "failed" if action.state == "failed" else "retry"
            audit.record_many(
                session,
                [audit.action_event(action, event, at=now, before={"state": was}, after=after)],
            )
        log.warning("action failed, will retry", extra={"action_id": action_id, "error": error})

    def _set_step(self, action_id: str, step: str, **values: object) -> None:
        with session_scope(self.factory) as session:
            now = self.clock()
            session.execute(
                update(Action)
                .where(Action.id == action_id)
                .values(step=step, lease_until=now + LEASE, updated_at=now, **values)
            )

    @staticmethod
    def _checkpoint(session: Session, checkpoint_id: str) -> Checkpoint:
        return session.execute(
            select(Checkpoint)
            .where(Checkpoint.id == checkpoint_id)
            .options(selectinload(Checkpoint.locations))
        ).scalar_one()

    def _checkpoint_event(
        self,
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
            at=self.clock(),
            before=before,
            after=after,
            reason=action.rule,
        )
        audit.record_many(session, [change])

    def _delete(self, action_id: str) -> None:
        """To the trash: the bytes stay until the purge."""
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            checkpoint = self._checkpoint(session, action.checkpoint_id)
            if checkpoint.pinned:
                self._close(session, action, "cancelled", "checkpoint is pinned")
                return
            if checkpoint.state == "active":
                count_active(
                    session, checkpoint.run_id, checkpoints=-1, size=-checkpoint.size_bytes
                )
            if checkpoint.state not in ("trashed", "deleted"):
                self._checkpoint_event(
                    session,
                    action,
                    checkpoint,
                    "trashed",
                    before={"state": checkpoint.state},
                    after={"state": "trashed"},
                )
                checkpoint.state = "trashed"
                checkpoint.trashed_at = self.clock()
                checkpoint.updated_by = action.actor
            self._close(session, action, "done")
            session.flush()
            if checkpoint.state == "trashed" and self.trash_retention <= timedelta(0):
                size = checkpoint.size_bytes
                now = self.clock()
                purge = purge_action(session, checkpoint.id, checkpoint.run_id, size, now)
                add_action(session, purge, now)
        crash_point("delete.trashed")

    def _purge(self, action_id: str) -> None:
        """Remove the bytes from every location, then mark the checkpoint deleted."""
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            checkpoint = self._checkpoint(session, action.checkpoint_id)
            if checkpoint.state == "deleted":
                self._close(session, action, "done")
                return
            if checkpoint.state != "trashed":
                self._close(session, action, "cancelled", f"checkpoint is {checkpoint.state}")
                return
            uris = [loc.uri for loc in checkpoint.locations]
            single_file = checkpoint.single_file
            for uri in uris:  # all of them before any byte goes: a purge is whole or nothing
                refuse_if_overlapping(session, uri, checkpoint.id, "purge")
        crash_point("purge.checked")
        for uri in uris:
            storage, key = self._storage(uri)
            remove_location(storage, key, single_file)
            crash_point("purge.location_removed")
        with session_scope(self.factory) as session:
            checkpoint = self._checkpoint(session, action.checkpoint_id)
            metrics.bytes_purged(checkpoint.size_bytes, [loc.tier for loc in checkpoint.locations])
            finished = session.get(Action, action_id)
            assert finished is not None
            self._checkpoint_event(
                session,
                finished,
                checkpoint,
                "purged",
                before={"state": checkpoint.state, **audit.placement(checkpoint.locations)},
                after={"state": "deleted", "tier": None, "locations": []},
            )
            for loc in list(checkpoint.locations):
                session.delete(loc)
            checkpoint.state = "deleted"
            checkpoint.updated_by = action.actor
            self._close(session, finished, "done")
        crash_point("purge.done")

    def _storage(self, uri: str) -> tuple[Storage, str]:
        located = locate(uri, self.tiers)
        return storage_for(located.tier), located.key

    def _transfer(self, action_id: str) -> None:
        """move, copy and restore: (restore) -> copy -> verify -> switch -> (move) remove."""
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            checkpoint = self._checkpoint(session, action.checkpoint_id)
            reason = self._refuse_transfer(action, checkpoint)
            if reason is not None:
                done = reason == "already there"
                self._close(
                    session, action, "done" if done else "cancelled", None if done else reason
                )
                return
            if action.dest_uri is None:
                planned_source, planned_dest = self._endpoints(session, action, checkpoint)
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
        dest_tier = self.tiers_by_name[action.to_tier]
        source, source_uri_key = self._storage(source_uri)
        dest, dest_uri_key = self._storage(dest_uri)
        # the prefix the manifest's paths hang from (a single file's: its directory)
        source_key = files_base(source_uri_key, single_file)
        dest_key = files_base(dest_uri_key, single_file)
        in_place = source_uri == dest_uri  # two tiers on one bucket prefix: a class change
        streamed: dict[str, dict[str, str]] = {}
        if step is None or step.startswith("restoring"):
            if not in_place and self._awaiting_restore(
                action_id, step, source, source_key, manifest
            ):
                return
            with self._lease_kept(action_id) as progress:
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
                        self._discard(dest, dest_uri_key, dest_uri, checkpoint_id)
                        raise
            self._set_step(action_id, "copied")
            crash_point("transfer.copied")
            step = "copied"
        if step == "copied":
            problems = verify_files(
                dest,
                dest_key,
                manifest,
                streamed=streamed,
                source=source,
                source_prefix=source_key,
            )
            crash_point("transfer.destination_checked")
            if problems:
                if not in_place:
                    self._discard(dest, dest_uri_key, dest_uri, checkpoint_id)
                raise VerificationFailed(
                    f"{dest_uri} does not match the manifest: " + "; ".join(problems[:5])
                )
            self._set_step(action_id, "verified")
            crash_point("transfer.verified")
            step = "verified"
        if step == "verified":
            self._switch(action_id, dest_uri)
            crash_point("transfer.switched")
            step = "switched"
        if kind == "move" and not in_place:
            with session_scope(self.factory) as session:
                refuse_if_overlapping(session, source_uri, checkpoint_id, "remove the source")
            remove_location(source, source_uri_key, single_file)
            crash_point("transfer.source_removed")
        self._finish(action_id, "done")
        crash_point("transfer.done")

    def _awaiting_restore(
        self,
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
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None
            now = self.clock()
            if polls == 0:  # the first wait is audited, not each poll
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
            action.state = "pending"
            action.attempts = max(0, action.attempts - 1)
            action.due_at = now + delay
            action.updated_at = now
            action.lease_owner = None
            action.lease_until = None
        crash_point("transfer.restore_pending")
        waiting = sum(1 for state in states.values() if state != "readable")
        log.info(
            "waiting for archive restore",
            extra={"action_id": action_id, "objects": waiting, "poll_in_s": delay.seconds},
        )
        return True

    @contextmanager
    def _lease_kept(self, action_id: str) -> Iterator[Progress]:
        """Renew the lease while a long copy runs, so no other worker takes the action,
        and write how far it got (`bytes_done`) every PROGRESS_EVERY."""
        stop = threading.Event()
        progress = Progress()

        def renew() -> None:
            while not stop.wait(PROGRESS_EVERY.total_seconds()):
                with session_scope(self.factory) as session:
                    session.execute(
                        update(Action)
                        .where(
                            Action.id == action_id,
                            Action.lease_owner == self.owner,
                            Action.state == "running",
                        )
                        .values(lease_until=self.clock() + LEASE, bytes_done=progress.value)
                    )

        thread = threading.Thread(target=renew, name=f"lease-{action_id}", daemon=True)
        thread.start()
        try:
            yield progress
        finally:
            stop.set()
            thread.join()

    def _discard(self, dest: Storage, dest_key: str, dest_uri: str, checkpoint_id: str) -> None:
        """Remove a bad or partial copy: the manifest's files at `dest_uri`, nothing else
        there, and nothing at all when the catalog lists that place or another checkpoint
        owns bytes there or around it (then it is not ours to remove)."""
        with session_scope(self.factory) as session:
            listed = session.execute(select(Location.id).where(Location.uri == dest_uri)).first()
            other = find_overlap(session, dest_uri, exclude_checkpoint=checkpoint_id)
            files, single_file = session.execute(
                select(Checkpoint.files, Checkpoint.single_file).where(
                    Checkpoint.id == checkpoint_id
                )
            ).one()
        if listed is None and other is None:
            base = files_base(dest_key, single_file)
            dest.delete_keys(join_key(base, str(entry["path"])) for entry in files or [])
            crash_point("transfer.copy_discarded")

    def _refuse_transfer(self, action: Action, checkpoint: Checkpoint) -> str | None:
        if checkpoint.state != "active":
            return f"checkpoint is {checkpoint.state}"
        if action.to_tier not in self.tiers_by_name:
            return f"unknown tier {action.to_tier!r}"
        if action.step is not None:
            return None  # resuming: the catalog may already have switched
        if action.kind == "move" and checkpoint.pinned:
            return "checkpoint is pinned"
        held = {loc.tier for loc in checkpoint.locations}
        if action.kind != "move" and action.to_tier in held:
            return "already there"
        primary = next((loc for loc in checkpoint.locations if loc.role == "primary"), None)
        if action.kind == "move" and primary is not None and primary.tier == action.to_tier:
            return "already there"
        return None

    def _endpoints(
        self, session: Session, action: Action, checkpoint: Checkpoint
    ) -> tuple[str, str]:
        primary = next(loc for loc in checkpoint.locations if loc.role == "primary")
        project, run_name = session.execute(
            select(Project.name, Run.name)
            .join(Run, Run.project_id == Project.id)
            .where(Run.id == checkpoint.run_id)
        ).one()
        tier = self.tiers_by_name[action.to_tier or ""]
        source_tier = self.tiers_by_name.get(primary.tier)
        if source_tier is not None and source_tier.url == tier.url:
            return primary.uri, primary.uri  # one bucket prefix, two classes: in place
        name = primary.uri.rsplit("/", 1)[-1] if checkpoint.single_file else None
        return primary.uri, placed_uri(tier, project, run_name, checkpoint.step, name)

    def _switch(self, action_id: str, dest_uri: str) -> None:
        """Catalog the verified copy, in one transaction with the step."""
        with session_scope(self.factory) as session:
            action = session.get(Action, action_id)
            assert action is not None and action.to_tier is not None
            tier = self.tiers_by_name[action.to_tier]
            checkpoint = self._checkpoint(session, action.checkpoint_id)
            was = audit.placement(checkpoint.locations)
            placed = list(checkpoint.locations)
            on_target = next((loc for loc in checkpoint.locations if loc.tier == tier.name), None)
            if action.kind == "move":
                primary = next((loc for loc in checkpoint.locations if loc.role == "primary"), None)
                if on_target is not None and on_target is not primary:
                    session.delete(on_target)
                    session.flush()
                    placed.remove(on_target)
                if primary is not None:
                    primary.tier, primary.uri = tier.name, dest_uri
                    primary.storage_class = tier.storage_class
                    checkpoint.uri = dest_uri  # a checkpoint's uri is its primary's, always
            elif on_target is None:
                replica = Location(
                    checkpoint_id=checkpoint.id,
                    tier=tier.name,
                    uri=dest_uri,
                    storage_class=tier.storage_class,
                    role="replica",
                )
                session.add(replica)
                placed.append(replica)
            before, after = audit.diff(was, audit.placement(placed))
            if after:  # not when a resumed action had switched already
                event = {"move": "moved", "copy": "copied"}.get(action.kind, "restored")
                self._checkpoint_event(
                    session, action, checkpoint, event, before=before, after=after
                )
            checkpoint.updated_by = action.actor
            now = self.clock()
            action.step = "switched"
            action.lease_until = now + LEASE
            action.updated_at = now
