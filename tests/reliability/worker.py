"""The worker process the crash tests kill: a real OS process that builds its own engine,
tiers and Worker, drains the ledger once, and exits (or dies at a crash point).

Children are forked from a fork server that imported this module once, so each one starts
in milliseconds instead of the seconds a fresh interpreter needs to import the service;
nothing (no engine, no storage client, no thread) is shared with the test process.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.context import ForkServerContext

from sqlalchemy.orm import configure_mappers

import app.storage.gcs  # noqa: F401  (imported by the first gs:// tier otherwise: 0.5 s a child)
from app.db.session import make_engine, make_session_factory
from app.services.lifecycle.crash import CRASH_AT_ENV, CRASH_TRACE_ENV
from app.services.lifecycle.worker import Worker
from app.settings import Settings
from app.storage.s3 import S3Storage
from app.tiers_config import load_tiers

# What every child would otherwise do first, done once in the fork server: the ORM's mapper
# configuration, and boto's S3 service model loaded into the shared session (no connection
# is opened).
configure_mappers()
S3Storage("warm-up", endpoint_url="http://127.0.0.1:9")

JOIN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WorkerJob:
    """What one worker process does: `ckpt worker --once` with a clock `clock_offset` ahead
    of the wall clock (leases expire and restore polls fall due without waiting)."""

    database_url: str
    data_dir: str
    tiers_file: str | None
    clock_offset: timedelta = timedelta(0)
    trash_retention: timedelta = timedelta(days=7)
    env: dict[str, str] = field(default_factory=dict)  # provider endpoints and credentials
    crash_at: str | None = None
    trace: str | None = None
    log: str | None = None  # the process's stdout and stderr go here (default: nowhere)


def worker_main(job: WorkerJob) -> None:
    """The child's entry point: configure the environment, drain, exit 0."""
    out = os.open(job.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    for name in (CRASH_AT_ENV, CRASH_TRACE_ENV):
        os.environ.pop(name, None)
    os.environ.update(job.env)
    if job.crash_at is not None:
        os.environ[CRASH_AT_ENV] = job.crash_at
    if job.trace is not None:
        os.environ[CRASH_TRACE_ENV] = job.trace
    settings = Settings(
        database_url=job.database_url,
        data_dir=job.data_dir,
        tiers_file=job.tiers_file,
        auth="off",
    )
    engine = make_engine(job.database_url, pool_size=2)
    try:
        executor = Worker(
            make_session_factory(engine),
            load_tiers(settings),
            trash_retention=job.trash_retention,
            owner=f"crash-test:{os.getpid()}",
            clock=lambda: datetime.now(UTC) + job.clock_offset,
        )
        executor.drain()
    finally:
        engine.dispose()


_context: ForkServerContext | None = None


def context() -> ForkServerContext:
    """The fork server context, its server preloading this module (started on first use)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        # `__main__` too: a child whose parent's main module the server has not imported
        # imports it again (under pytest, pytest itself).
        ctx.set_forkserver_preload(["__main__", __name__])
        _context = ctx
    return _context


def run_worker(job: WorkerJob) -> int:
    """Run `job` in a new process and wait; its exit code (-9: killed by SIGKILL)."""
    process = context().Process(target=worker_main, args=(job,), name="ckpt-crash-worker")
    process.start()
    process.join(JOIN_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
        raise AssertionError(f"the worker did not finish within {JOIN_TIMEOUT_S:.0f} s")
    assert process.exitcode is not None
    return process.exitcode
