"""Running an import: stream the tree's listing through the layout recognizer, register
what it finds in batches, then evaluate the project once (DESIGN section 14).

Memory holds one checkpoint's objects and one batch, whatever the tree's size: the
listing arrives a page at a time in key order, and a checkpoint's objects are contiguous
in it. Each batch commits with the import's counters and its cursor (the last key every
count accounts for), so an import whose process is killed resumes after that key, on
whichever process claims it once its lease lapses, and counts nothing twice.

The policy is evaluated once the whole tree is in, as one evaluation of the project: an
evaluation per batch would weigh each batch's deletes against a catalog still filling up,
and the blast-radius hold would let a thinning policy delete a freshly adopted tree in
small bites instead of holding its deletes for an admin.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db.dialect import on_postgresql
from app.db.models import ImportRow
from app.db.session import session_scope
from app.domain.ids import new_id
from app.domain.tier import Tier
from app.services.catalog import imports
from app.services.catalog.adopted_runs import Adoption
from app.services.catalog.adoption import adopt
from app.services.catalog.imports import LostLease, Progress
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.import_scan import RENEW, ScanJob, Stretch, scan, scan_in_child
from app.services.lifecycle.sweep import run_sweep
from app.storage.registry import StorageRegistry

log = logging.getLogger("app.imports")
DEFAULT_LEASE = timedelta(seconds=30)  # CKPT_IMPORT_LEASE
READERS = 16  # trainer_state.json files read at once, on an object store
ANALYZE_AFTER = 10_000  # checkpoints registered by one import before the catalog is analyzed
# What the evaluation after an import filters and joins on, and the small tables whose
# estimates multiply into its plans (`projects`: autovacuum analyzes no table until 50 of
# its rows changed; unanalyzed, it made PostgreSQL expect one run of the project where it
# had 250, and look up 100,000 locations one by one). A whole-table ANALYZE also sorts a
# sample of every other column: 0.40 s after 100,000 adopted checkpoints, against 0.15 s
# for these; autovacuum analyzes the rest soon after.
ANALYZE_FOR_EVALUATION = (
    "ANALYZE checkpoints (id, run_id, state, locked_until), locations (checkpoint_id, role),"
    " runs, projects"
)


def _now() -> datetime:
    return datetime.now(UTC)


class Stopped(Exception):
    """This process is shutting down: the import stays `running`, and the process that
    claims it once its lease lapses goes on from its last batch."""


class Importer:
    """Runs imports in threads of this process, and takes over the ones a dead process
    left (`resume_abandoned`, from the scheduler)."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        tiers: list[Tier],
        storages: StorageRegistry,
        *,
        lease: timedelta = DEFAULT_LEASE,
        on_sweep: Callable[[], None] | None = None,
    ) -> None:
        self.factory = factory
        self.tiers = {tier.name: tier for tier in tiers}
        self.tier_list = tiers
        self.storages = storages
        self.lease = lease
        self.owner = new_id("proc")
        self._on_sweep = on_sweep
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def stop(self, timeout: float = 10.0) -> None:
        """Let every running import write its last batch and stop."""
        self._stop.set()
        self.wait(timeout)

    def start(self, import_id: str) -> None:
        """Run the import (claimed by this process) in a thread of its own."""
        if self._stop.is_set():
            return  # shutting down: the next process takes it over
        with self._lock:
            self._threads = {i: t for i, t in self._threads.items() if t.is_alive()}
            if import_id in self._threads:
                return
            thread = threading.Thread(
                target=self.run, args=(import_id,), name=f"ckpt-import-{import_id}", daemon=True
            )
            self._threads[import_id] = thread
        thread.start()

    def resume_abandoned(self) -> list[str]:
        with session_scope(self.factory) as session:
            claimed = imports.claim_abandoned(session, self.owner, lease=self.lease, now=_now())
        for import_id in claimed:
            log.info("import resumed", extra={"import_id": import_id})
            self.start(import_id)
        return claimed

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until this process runs no import (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads.values())

    # -- one import --------------------------------------------------------------------------

    def run(self, import_id: str) -> None:
        """List, register, evaluate, finish; a failure is recorded on the import."""
        try:
            with session_scope(self.factory) as session:
                row = imports.get_import(session, import_id)
                session.expunge(row)
            started = time.monotonic()
            self._list_and_register(row)
            listed = time.monotonic()
            sweep_id = None if row.dry_run else self._evaluate(row)
            with session_scope(self.factory) as session:
                imports.finish(session, import_id, self.owner, now=_now(), sweep_id=sweep_id)
            log.info(
                "import done",
                extra={
                    "import_id": import_id,
                    "listing_and_registering_s": round(listed - started, 3),
                    "evaluation_s": round(time.monotonic() - listed, 3),
                },
            )
        except LostLease:
            log.warning("import taken over by another process", extra={"import_id": import_id})
        except Stopped:
            log.info("import paused by shutdown", extra={"import_id": import_id})
        except Exception as error:  # recorded on the import, where its caller looks
            log.exception("import failed", extra={"import_id": import_id})
            with session_scope(self.factory) as session:
                imports.finish(session, import_id, self.owner, now=_now(), error=str(error))

    def _list_and_register(self, row: ImportRow) -> None:
        """Each stretch the listing hands over is written by `writer`, one at a time and in
        order, while the listing goes on (the database works on a core of its own
        meanwhile). At most one stretch waits for the one being written."""
        tier = self.tiers.get(row.tier)
        if tier is None:
            raise RuntimeError(f"tier {row.tier!r} is no longer configured")
        job = ScanJob(
            uri=row.uri,
            key=_relative(row.uri, tier),
            layout=row.layout,
            run=row.run,
            cursor=row.cursor,
            local_root=tier.parsed.path if tier.is_local else None,
        )
        with (
            ThreadPoolExecutor(READERS, thread_name_prefix="ckpt-import-read") as pool,
            ThreadPoolExecutor(1, thread_name_prefix="ckpt-import-write") as writer,
            contextlib.ExitStack() as stack,
        ):
            if tier.is_local:
                patience = self.lease.total_seconds()  # silent that long: the lease lapsed
                pieces = stack.enter_context(scan_in_child(job, patience=patience))
            else:
                pieces = scan(self.storages.storage_for(tier), job, pool)
            adoption = Adoption(
                import_id=row.id,
                project=row.project,
                klass=row.klass,
                tier=tier,
                active=row.active,
                dry_run=row.dry_run,
                actor=row.created_by,
            )
            pending: Future[None] | None = None
            for piece in pieces:
                if self._stop.is_set():
                    raise Stopped(row.id)
                if piece == RENEW:
                    with session_scope(self.factory) as session:
                        imports.renew(session, row.id, self.owner, lease=self.lease, now=_now())
                    continue
                if pending is not None:
                    pending.result()  # the one before, in order; its failure stops the import
                pending = writer.submit(self._commit, row, adoption, piece)
            if pending is not None:
                pending.result()

    def _commit(self, row: ImportRow, adoption: Adoption, stretch: Stretch) -> None:
        """One stretch's checkpoints and the import's counters and cursor, together."""
        progress = Progress(
            cursor=stretch.cursor,
            listed=stretch.listed,
            discovered=stretch.discovered,
            unrecognized=stretch.unrecognized,
            incomplete=stretch.incomplete,
            unrecognized_keys=stretch.unrecognized_keys if row.dry_run else None,
        )
        batch = stretch.with_metrics()
        now = _now()
        with session_scope(self.factory) as session:
            outcome = adopt(session, adoption, batch, now)
            imports.record_progress(
                session, row.id, self.owner, progress, outcome, lease=self.lease, now=now
            )
        crash_point("import.batch_committed")

    def _evaluate(self, row: ImportRow) -> str | None:
        """One evaluation of the project, as its own sweep (the blast-radius hold sees the
        whole adopted tree at once)."""
        self._refresh_statistics(row.id)
        sweep_id, actions = run_sweep(
            self.factory,
            tiers=self.tier_list,
            now=_now(),
            trigger="import",
            actor=row.created_by,
            project=row.project,
        )
        if actions and self._on_sweep is not None:
            self._on_sweep()
        return sweep_id

    def _refresh_statistics(self, import_id: str) -> None:
        """After a large import, PostgreSQL's statistics of the catalog still describe the
        tables as they were: the evaluation's queries were planned for a catalog a fraction
        of the size (an evaluation of 100,000 adopted checkpoints took 1.9 s, 0.9 s once
        analyzed). Autovacuum would catch up, later. Without the tables' ownership
        PostgreSQL skips them with a warning, and the evaluation goes on."""
        with session_scope(self.factory) as session:
            if not on_postgresql(session):
                return
            if imports.get_import(session, import_id).registered < ANALYZE_AFTER:
                return
            session.execute(text(ANALYZE_FOR_EVALUATION))


def _relative(uri: str, tier: Tier) -> str:
    """The tree's key under its tier ("" for the tier's root)."""
    root = tier.parsed.join("").rstrip("/")
    return uri.rstrip("/")[len(root) :].strip("/")
