"""Background work of one process: the worker loop, registration-triggered evaluations,
and the periodic jobs (sweep, purge, abandoned reservations, reconcile). Jobs only enqueue
(reconcile only reads and marks health, the abandonment check only aborts reservations);
workers execute."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from app.db.session import session_scope
from app.domain.access import SCHEDULER_ACTOR
from app.domain.tier import Tier
from app.services.catalog.checkpoints import DEFAULT_RESERVATION_TTL
from app.services.catalog.reservations import abort_abandoned
from app.services.lifecycle.importer import DEFAULT_LEASE, Importer
from app.services.lifecycle.reconcile import reconcile, turn
from app.services.lifecycle.sweep import requested_evaluations, run_sweep
from app.services.lifecycle.trash import enqueue_due_purges
from app.services.lifecycle.worker import Worker
from app.storage.registry import StorageRegistry

log = logging.getLogger("app.scheduler")
PURGE_PERIOD = timedelta(seconds=30)
# DESIGN section 12 asks for at least once a minute: a reservation is abandoned within
# this long after its `reserved_until` (sooner with a short CKPT_RESERVATION_TTL).
ABANDONMENT_PERIOD = timedelta(seconds=30)
IDLE_POLL_SECONDS = 1.0
EVALUATION_POLL_SECONDS = 0.5  # requests made by other processes (API replicas)
COALESCE_SECONDS = 0.05
REQUEST_BATCH = 200


def _now() -> datetime:
    return datetime.now(UTC)


def _quarter(of: timedelta, at_most: timedelta) -> timedelta:
    """A periodic check a quarter of the delay it enforces, between one second (each check
    is one indexed query) and `at_most`: a short delay is kept about as promptly as it
    promises, without a long one costing a query a second."""
    return min(at_most, max(timedelta(seconds=1), of / 4))


def abandonment_period(reservation_ttl: timedelta) -> timedelta:
    """How often the scheduler looks for lapsed reservations."""
    return _quarter(reservation_ttl, ABANDONMENT_PERIOD)


def purge_period(trash_retention: timedelta) -> timedelta:
    """How often the scheduler looks for trash whose retention is over (`0s`: deleted
    checkpoints are purged within a second or so, not up to 30 s later)."""
    return _quarter(trash_retention, PURGE_PERIOD)


class Runtime:
    def __init__(
        self,
        factory: sessionmaker[Session],
        tiers: list[Tier],
        *,
        sweep_interval: timedelta,
        trash_retention: timedelta,
        reconcile_interval: timedelta = timedelta(0),
        worker: bool = True,
        scheduler: bool = True,
        evaluator: bool = True,
        storages: StorageRegistry | None = None,
        import_lease: timedelta = DEFAULT_LEASE,
        reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
    ) -> None:
        self.factory = factory
        # the adapters this process's roles share (the API's routes too, when it serves)
        self.storages = storages or StorageRegistry()
        self.tiers = tiers
        self.sweep_interval = sweep_interval
        self.trash_retention = trash_retention
        self.reconcile_interval = reconcile_interval
        self.abandonment_period = abandonment_period(reservation_ttl)
        self.purge_period = purge_period(trash_retention)
        self.executor = Worker(
            factory, tiers, trash_retention=trash_retention, storages=self.storages
        )
        self.roles = {"worker": worker, "scheduler": scheduler, "evaluator": evaluator}
        # Imports run in the process that was asked for one; the scheduler takes over the
        # ones whose process died (a lapsed lease), checking a few times per lease.
        self.imports = Importer(
            factory, tiers, self.storages, lease=import_lease, on_sweep=self.wake_workers
        )
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._evaluate = threading.Event()
        self._busy = 0
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._scheduler: BackgroundScheduler | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.roles["worker"]:
            self._spawn("worker", self._worker_loop)
        if self.roles["evaluator"]:
            self._spawn("evaluator", self._evaluator_loop)
        if self.roles["scheduler"]:
            scheduler = BackgroundScheduler(timezone=UTC)
            scheduler.add_job(
                self.sweep,
                "interval",
                seconds=self.sweep_interval.total_seconds(),
                id="sweep",
                max_instances=1,
                coalesce=True,
            )
            scheduler.add_job(
                self.purge,
                "interval",
                seconds=self.purge_period.total_seconds(),
                id="purge",
                max_instances=1,
                coalesce=True,
                next_run_time=_now(),
            )
            scheduler.add_job(
                self.abandon,
                "interval",
                seconds=self.abandonment_period.total_seconds(),
                id="abandon",
                max_instances=1,
                coalesce=True,
                next_run_time=_now(),
            )
            scheduler.add_job(
                self.imports.resume_abandoned,
                "interval",
                seconds=max(1.0, self.imports.lease.total_seconds() / 3),
                id="imports",
                max_instances=1,
                coalesce=True,
                next_run_time=_now(),
            )
            if self.reconcile_interval > timedelta(0):
                scheduler.add_job(
                    self.reconcile,
                    "interval",
                    seconds=self.reconcile_interval.total_seconds(),
                    id="reconcile",
                    max_instances=1,
                    coalesce=True,
                )
            scheduler.start()
            self._scheduler = scheduler

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._evaluate.set()
        with self._cond:
            self._cond.notify_all()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
        self.imports.stop()
        for thread in self._threads:
            thread.join(timeout=30)

    def _spawn(self, name: str, target: object) -> None:
        thread = threading.Thread(target=target, name=f"ckpt-{name}", daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    # -- jobs ------------------------------------------------------------------------------

    def sweep(self) -> None:
        started = time.perf_counter()
        try:
            sweep_id, ids = run_sweep(
                self.factory,
                tiers=self.tiers,
                now=_now(),
                trigger="schedule",
                actor=SCHEDULER_ACTOR,
                due_only=True,
            )
        except Exception:
            log.exception("sweep failed")
            return
        log.info(
            "sweep",
            extra={
                "sweep_id": sweep_id,
                "actions": len(ids),
                "seconds": round(time.perf_counter() - started, 3),
            },
        )
        self.wake_workers()

    def reconcile(self) -> None:
        """Compare the tiers with the catalog; drift marks checkpoints, orphans are only
        reported (an admin deletes them through the API)."""
        try:
            with turn(self.factory) as mine:
                if mine:
                    reconcile(self.factory, self.tiers, storages=self.storages)
                else:
                    log.info("reconciliation skipped: another scheduler is running one")
        except Exception:
            log.exception("reconciliation failed")

    def purge(self) -> None:
        try:
            with session_scope(self.factory) as session:
                created = enqueue_due_purges(session, retention=self.trash_retention, now=_now())
        except Exception:
            log.exception("purge scan failed")
            return
        if created:
            log.info("purges enqueued", extra={"actions": created})
            self.wake_workers()

    def abandon(self, now: datetime | None = None) -> list[str]:
        """Abort the reservations whose `reserved_until` has passed (at `now`, the clock's
        time unless given); returns their ids. They go to the trash, where the purge job
        finds them after the trash period."""
        try:
            with session_scope(self.factory) as session:
                aborted = abort_abandoned(session, now=now or _now())
        except Exception:
            log.exception("abandoned reservations scan failed")
            return []
        if aborted:
            log.info("abandoned reservations aborted", extra={"checkpoints": len(aborted)})
        return aborted

    def run_import(self, import_id: str) -> None:
        """Run an import this process recorded (and claimed) in a thread of its own."""
        self.imports.start(import_id)

    # -- registration-triggered evaluation -------------------------------------------------

    def request_evaluation(self, run_id: str) -> None:
        """A run's evaluation was asked for (the request itself is already in the database):
        look now rather than at the next poll."""
        if self.roles["evaluator"]:
            self._evaluate.set()

    def _evaluator_loop(self) -> None:
        while not self._stop.is_set():
            self._evaluate.wait(EVALUATION_POLL_SECONDS)
            self._evaluate.clear()
            # A job registering in a burst (or many jobs at once) needs one evaluation of
            # each run per window, not one per registration.
            self._stop.wait(COALESCE_SECONDS)
            try:
                self._evaluate_requested()
            except Exception:
                log.exception("evaluation of requested runs failed")

    def _evaluate_requested(self) -> None:
        with self._cond:
            self._busy += 1
        try:
            while not self._stop.is_set():
                now = _now()
                with session_scope(self.factory) as session:
                    batch = requested_evaluations(session, before=now)
                for run_id, requested_at in batch:
                    try:
                        run_sweep(
                            self.factory,
                            tiers=self.tiers,
                            now=now,
                            trigger="registration",
                            actor=SCHEDULER_ACTOR,
                            run_id=run_id,
                            answers_request=requested_at,
                        )
                    except Exception:
                        log.exception("evaluation failed", extra={"run_id": run_id})
                if batch:
                    self.wake_workers()
                if len(batch) < REQUEST_BATCH:
                    return
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no run waits for its evaluation (tests, graceful shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with session_scope(self.factory) as session:
                waiting = requested_evaluations(session, before=_now() + timedelta(days=1), limit=1)
            with self._cond:
                busy = self._busy
            if not waiting and not busy:
                return True
            self._evaluate.set()
            time.sleep(0.02)
        return False

    # -- worker ----------------------------------------------------------------------------

    def wake_workers(self) -> None:
        self._wake.set()

    def _worker_loop(self) -> None:
        while not self._stop.is_set():
            try:
                did = self.executor.run_once()
            except Exception:
                log.exception("worker step failed")
                did = False
            if not did:
                self._wake.wait(IDLE_POLL_SECONDS)
                self._wake.clear()
