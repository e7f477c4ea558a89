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

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from sqlalchemy.orm import Session, sessionmaker

from app.db.models import ImportRow
from app.db.session import session_scope
from app.domain.ids import new_id
from app.domain.layouts import (
    Found,
    Incomplete,
    Recognizer,
    hf_metrics,
    run_name,
    run_segment,
)
from app.domain.tier import Tier
from app.services.catalog import imports
from app.services.catalog.adopted_runs import Adoption, Candidate
from app.services.catalog.adoption import adopt
from app.services.catalog.imports import LostLease, Progress
from app.services.catalog.manifest import file_entry
from app.services.lifecycle.crash import crash_point
from app.services.lifecycle.sweep import run_sweep
from app.storage.base import ObjectInfo, Storage, join_key
from app.storage.registry import StorageRegistry

log = logging.getLogger("app.imports")
BATCH = 1000  # checkpoints per transaction
FLUSH_SECONDS = 2.0  # progress is written at least this often while listing
DEFAULT_LEASE = timedelta(seconds=30)  # CKPT_IMPORT_LEASE
TRAINER_STATE_LIMIT = 64 * 1024 * 1024  # a trainer_state.json larger than this is not read
READERS = 16  # trainer_state.json files read at once


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Stretch:
    """What the listing found since the last write."""

    batch: list[Candidate] = field(default_factory=list)
    incomplete: list[tuple[str, str]] = field(default_factory=list)
    unrecognized_keys: list[str] = field(default_factory=list)
    # Trainer checkpoints' metrics, by position in the batch: a read to make, or on an
    # object store the result of one already under way
    reads: list[tuple[int, Callable[[], dict[str, float]]]] = field(default_factory=list)
    listed: int = 0
    discovered: int = 0
    unrecognized: int = 0


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
            self._list_and_register(row)
            sweep_id = None if row.dry_run else self._evaluate(row)
            with session_scope(self.factory) as session:
                imports.finish(session, import_id, self.owner, now=_now(), sweep_id=sweep_id)
            log.info("import done", extra={"import_id": import_id})
        except LostLease:
            log.warning("import taken over by another process", extra={"import_id": import_id})
        except Stopped:
            log.info("import paused by shutdown", extra={"import_id": import_id})
        except Exception as error:  # recorded on the import, where its caller looks
            log.exception("import failed", extra={"import_id": import_id})
            with session_scope(self.factory) as session:
                imports.finish(session, import_id, self.owner, now=_now(), error=str(error))

    def _list_and_register(self, row: ImportRow) -> None:
        with (
            ThreadPoolExecutor(READERS, thread_name_prefix="ckpt-import-read") as pool,
            ThreadPoolExecutor(1, thread_name_prefix="ckpt-import-write") as writer,
        ):
            self._stream(row, pool, writer)

    def _stream(self, row: ImportRow, pool: ThreadPoolExecutor, writer: ThreadPoolExecutor) -> None:
        """List and recognise in this thread; each batch is written by `writer`, one at a
        time and in order, while the listing goes on (the database works on its own core
        meanwhile). At most one batch waits for the one being written."""
        tier = self.tiers.get(row.tier)
        if tier is None:
            raise RuntimeError(f"tier {row.tier!r} is no longer configured")
        storage = self.storages.storage_for(tier)
        root = _relative(row.uri, tier)
        adoption = Adoption(
            import_id=row.id,
            project=row.project,
            klass=row.klass,
            tier=tier,
            active=row.active,
            dry_run=row.dry_run,
            actor=row.created_by,
        )
        recognizer: Recognizer[ObjectInfo] = Recognizer(
            row.layout, keep_unrecognized=imports.UNRECOGNIZED_SAMPLE
        )
        counted = 0  # of recognizer.unrecognized, in the stretches so far
        naming = _Naming(row.uri, row.run)
        stretch = _Stretch()
        settled, settled_listed = row.cursor, 0  # what the next write may claim as done
        previous: str | None = None
        flushed = time.monotonic()
        pending: Future[None] | None = None

        def write(cursor: str | None, listed: int) -> None:
            nonlocal stretch, flushed
            progress = Progress(
                cursor=cursor,
                listed=listed,
                discovered=stretch.discovered,
                unrecognized=stretch.unrecognized,
                incomplete=stretch.incomplete,
                unrecognized_keys=stretch.unrecognized_keys if row.dry_run else None,
            )
            done = stretch

            def commit() -> None:
                batch = _with_metrics(done.batch, done.reads)
                now = _now()
                with session_scope(self.factory) as session:
                    outcome = adopt(session, adoption, batch, now)
                    imports.record_progress(
                        session, row.id, self.owner, progress, outcome, lease=self.lease, now=now
                    )
                crash_point("import.batch_committed")

            nonlocal pending
            if pending is not None:
                pending.result()  # the one before, in order; its failure stops the import
            pending = writer.submit(commit)
            stretch = _Stretch(listed=stretch.listed - listed)
            flushed = time.monotonic()

        def settle(results: Iterator[Found[ObjectInfo] | Incomplete]) -> None:
            nonlocal counted
            for result in results:
                if isinstance(result, Incomplete):
                    stretch.incomplete.append((result.key, result.reason))
                else:
                    stretch.discovered += 1
                    if result.layout == "hf" and "trainer_state.json" in dict(result.files):
                        state = join_key(join_key(root, result.key), "trainer_state.json")
                        read: Callable[[], dict[str, float]]
                        read = partial(_trainer_metrics, storage, state, result.step)
                        if not tier.is_local:  # read while the listing goes on
                            read = pool.submit(read).result
                        stretch.reads.append((len(stretch.batch), read))
                    stretch.batch.append(self._candidate(storage, root, naming, result))
            stretch.unrecognized += recognizer.unrecognized - counted
            counted = recognizer.unrecognized
            stretch.unrecognized_keys.extend(recognizer.unrecognized_keys)
            recognizer.unrecognized_keys.clear()

        for info in storage.iter_prefix(root, start_after=row.cursor):
            if self._stop.is_set():
                raise Stopped(row.id)
            stretch.listed += 1
            settle(recognizer.add(info.key, info))
            if recognizer.open_from is None:
                settled, settled_listed = info.key, stretch.listed
            elif recognizer.open_from == info.key and previous is not None:
                settled, settled_listed = previous, stretch.listed - 1
            previous = info.key
            due = time.monotonic() - flushed > FLUSH_SECONDS
            if len(stretch.batch) >= BATCH or (due and settled != row.cursor):
                write(settled, settled_listed)
                row.cursor, settled_listed = settled, 0
            elif due:
                with session_scope(self.factory) as session:
                    imports.renew(session, row.id, self.owner, lease=self.lease, now=_now())
                flushed = time.monotonic()
        settle(recognizer.finish())
        write(previous if previous is not None else row.cursor, stretch.listed)
        assert pending is not None
        pending.result()

    def _candidate(
        self, storage: Storage, root: str, naming: _Naming, found: Found[ObjectInfo]
    ) -> Candidate:
        files = [file_entry(name, info) for name, info in found.files]
        modified = [info.modified for _, info in found.files if info.modified is not None]
        run, run_uri = naming.run_of(found.run_path)
        return Candidate(
            key=found.key,
            run=run,
            run_uri=run_uri,
            step=found.step,
            uri=naming.uri_of(found.key),
            layout=found.layout,
            files=files,
            size_bytes=sum(int(entry["size_bytes"]) for entry in files),
            created_at=max(modified) if modified else _now(),
            metrics={},  # a Trainer's are read with the rest of its batch (_with_metrics)
            single_file=found.single_file,
        )

    def _evaluate(self, row: ImportRow) -> str | None:
        """One evaluation of the project, as its own sweep (the blast-radius hold sees the
        whole adopted tree at once)."""
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


class _Naming:
    """Uris and run names of what an import finds (relative keys in, catalog names out)."""

    def __init__(self, root_uri: str, run: str | None) -> None:
        self.root = root_uri.rstrip("/")
        self.root_name = self.root.rsplit("/", 1)[-1]
        self.run = run
        self._last: tuple[str, tuple[str, str]] | None = None

    def uri_of(self, key: str) -> str:
        return f"{self.root}/{key}"

    def run_of(self, run_path: str) -> tuple[str, str]:
        """(run name, uri of the directory it was named after)."""
        if self._last is not None and self._last[0] == run_path:
            return self._last[1]
        name, _ = run_name(run_path, self.root_name)
        at = run_segment(run_path)
        named_after = "/".join(run_path.split("/")[: at + 1]) if at is not None else ""
        where = f"{self.root}/{named_after}" if named_after else self.root
        found = (self.run or name, where)
        self._last = (run_path, found)
        return found


def _relative(uri: str, tier: Tier) -> str:
    """The tree's key under its tier ("" for the tier's root)."""
    root = tier.parsed.join("").rstrip("/")
    return uri.rstrip("/")[len(root) :].strip("/")


def _with_metrics(
    batch: list[Candidate], reads: list[tuple[int, Callable[[], dict[str, float]]]]
) -> list[Candidate]:
    """The batch with each Trainer checkpoint's metrics. On an object store each
    `trainer_state.json` is a request, and one after the other they would cost more than
    the rest of the import: they were sent to the readers as each checkpoint was found,
    and are collected here. A local file is read in less time than a thread switch takes,
    so it is read now."""
    for position, metrics in reads:
        batch[position].metrics.update(metrics())  # each candidate's own dict, empty until now
    return batch


def _trainer_metrics(storage: Storage, key: str, step: int) -> dict[str, float]:
    """A Trainer checkpoint's eval metrics at its step; none when the file cannot be read
    (the checkpoint is adopted all the same)."""
    try:
        parsed = json.loads(storage.read_small(key, TRAINER_STATE_LIMIT))
    except Exception:  # a torn, foreign or oversized file: the metrics are a courtesy
        log.warning("trainer_state.json unreadable", extra={"key": key}, exc_info=True)
        return {}
    return hf_metrics(parsed, step) if isinstance(parsed, dict) else {}
