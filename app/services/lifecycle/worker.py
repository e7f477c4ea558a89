"""Workers claim ledger actions and run them: a transfer's phases (steps.py), a delete to
the trash or a purge (trash.py). A worker holds no SQL of its own: the ledger records
every claim, step and outcome, so a worker killed anywhere leaves an action the next one
resumes from its `step`. Safe to run in many processes on one PostgreSQL.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from app import metrics
from app.domain.states import FINAL_STATES, ActionKind, ActionState
from app.domain.tier import Tier
from app.services.lifecycle import ledger, locks, steps, trash
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.ledger import MAX_ATTEMPTS
from app.storage.base import ObjectLocked, StorageError, is_permanent
from app.storage.registry import StorageRegistry
from app.storage.retry import counting_retries
from app.storage.transfer import VerificationFailed

log = logging.getLogger("app.worker")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _tallied(execute: Callable[[Worker, str], None]) -> Callable[[Worker, str], None]:
    """Count the transient storage retries made while one action executes (its adapters'
    thread pools included: they run in the caller's context) and record them."""

    @functools.wraps(execute)
    def run(self: Worker, action_id: str) -> None:
        with counting_retries() as tally:
            execute(self, action_id)
        record_retries(self.factory, action_id, tally.count)

    return run


def record_retries(factory: sessionmaker[Session], action_id: str, retries: int) -> None:
    """After one execution of an action: its storage retries are added to its ledger row,
    and they and its outcome go to the metrics and to a log line (`action finished` once it
    is done, failed or cancelled)."""
    kind, state, attempts, total = ledger.add_retries(factory, action_id, retries)
    metrics.action_executed(kind, state, retries)
    finished = state in FINAL_STATES
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


class Worker:
    """Claims and executes actions, one at a time."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        tiers: list[Tier],
        *,
        trash_retention: timedelta,
        owner: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        storages: StorageRegistry | None = None,
    ) -> None:
        self.factory = factory
        self.tiers = tiers
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}"
        self.clock = clock
        self.context = steps.Context(
            factory=factory,
            tiers=tiers,
            storages=storages or StorageRegistry(),
            owner=self.owner,
            clock=clock,
            trash_retention=trash_retention,
        )

    def claim(self) -> str | None:
        """Take one due action (or one whose lease expired); None when there is none."""
        return ledger.claim(self.factory, self.owner, self.clock())

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

    @_tallied
    def execute(self, action_id: str) -> None:
        run: dict[str, Callable[[steps.Context, str], None]] = {
            ActionKind.DELETE: trash.delete,
            ActionKind.PURGE: trash.purge,
        }
        try:
            kind = ledger.load(self.factory, action_id).kind
            run.get(kind, steps.transfer)(self.context, action_id)
        except VerificationFailed as error:
            self._fail(action_id, f"verification failed: {error}")
        except (StorageError, OSError) as error:
            reason = f"{type(error).__name__}: {error}"
            if is_permanent(error):  # waiting will not heal it: fail now, not after 5 tries
                if isinstance(error, ObjectLocked):  # not planned again before the date
                    checkpoint_id = ledger.load(self.factory, action_id).checkpoint_id
                    locks.record_refusal(self.factory, checkpoint_id, error, self.clock())
                self._remove_partial_copy(action_id)
                self._fail(action_id, reason)
                return
            if ledger.load(self.factory, action_id).attempts >= MAX_ATTEMPTS:
                self._remove_partial_copy(action_id)
            ledger.retry(self.factory, action_id, reason, self.clock())
            crash_point("action.retry_scheduled")
            log.warning(
                "action failed, will retry", extra={"action_id": action_id, "error": reason}
            )

    def _fail(self, action_id: str, error: str) -> None:
        """End the action `failed` with its reason. A partial copy is removed before (a
        worker killed in between leaves an action the next one runs again, never a copy
        nobody owns)."""
        ledger.finish(self.factory, action_id, ActionState.FAILED, self.clock(), error=error)
        crash_point("action.failed")
        log.warning("action failed", extra={"action_id": action_id, "error": error})

    def _remove_partial_copy(self, action_id: str) -> None:
        """A transfer about to fail for good leaves no partial copy at its destination
        (the files copied before the error); a place the catalog lists is never touched."""
        action = ledger.load(self.factory, action_id)
        dest_uri = action.dest_uri
        if dest_uri is None or dest_uri == action.source_uri:
            return
        try:
            dest, dest_key = self.context.storage(dest_uri)
            steps.discard(self.context, dest, dest_key, dest_uri, action.checkpoint_id)
        except (StorageError, OSError) as error:  # left for reconcile to report as an orphan
            log.warning(
                "could not remove a failed transfer's partial copy",
                extra={"action_id": action_id, "error": f"{type(error).__name__}: {error}"},
            )
