"""Crash injection: named points in the worker where a test can have the process kill itself.

The executor calls `crash_point(name)` right after every storage call and every catalog
commit; an import calls it after each batch it commits. In production neither variable
below is set and a call costs two dictionary lookups. The reliability tests set them in a
worker process:

- `CKPT_CRASH_AT=<name>` or `<name>#<n>`: the process sends itself SIGKILL the first (or
  the n-th) time it reaches that point. No handler, no cleanup, no flush: the way a worker
  dies when its machine is lost or the kernel kills it for memory.
- `CKPT_CRASH_TRACE=<file>`: every point reached is appended to that file as a line
  `<name>#<n>` (the n-th time this process reached it), so a test learns which points an
  action passes through without listing them by hand.

Every name must be declared in `POINTS` or `IMPORT_POINTS`; reaching an undeclared one
while tracing or crashing raises, so a new point cannot escape the tests that cover every
declared one.
"""

from __future__ import annotations

import os
import signal
import threading

CRASH_AT_ENV = "CKPT_CRASH_AT"
CRASH_TRACE_ENV = "CKPT_CRASH_TRACE"

# Every point the executor declares, in the order an action meets them.
POINTS: tuple[str, ...] = (
    "worker.claimed",  # the claim committed: running, leased, nothing done yet
    "delete.trashed",  # the delete's one transaction: trashed and done
    "purge.checked",  # the purge found the checkpoint trashed (nothing written)
    "purge.location_removed",  # one location's objects deleted, the catalog still lists it
    "purge.done",  # locations dropped, checkpoint deleted, action done
    "transfer.started",  # the action recorded its source and destination
    "transfer.restore_requested",  # one archived source object asked to be restored
    "transfer.restore_pending",  # back to pending until the restore completes
    "transfer.class_changed",  # an in-place class change ran over every object
    "transfer.uploads_aborted",  # a previous attempt's unfinished uploads aborted
    "transfer.file_copied",  # one file copied (others may still be copying)
    "transfer.copy_discarded",  # a copy that failed verification removed
    "transfer.copied",  # step `copied` committed
    "transfer.destination_checked",  # the destination read back against the manifest
    "transfer.verified",  # step `verified` committed
    "transfer.switched",  # the catalog lists the copy (a move: as the primary)
    "transfer.source_removed",  # a move removed the source objects
    "transfer.done",  # the action committed `done`
    "action.failed",  # the action committed `failed` (verification failed)
    "action.retry_scheduled",  # a storage error: pending again later, or failed at the cap
)

# An import's points: after a batch is committed, so a killed import always has one to
# resume from (and a test need not race the import to kill it mid-tree).
IMPORT_POINTS: tuple[str, ...] = ("import.batch_committed",)

_DECLARED = frozenset(POINTS + IMPORT_POINTS)
_counts: dict[str, int] = {}
_lock = threading.Lock()


class UndeclaredCrashPoint(LookupError):
    """A crash point whose name is not in POINTS."""


def crash_point(name: str) -> None:
    """Die here when the environment asks for it; otherwise do nothing (see module doc)."""
    at = os.environ.get(CRASH_AT_ENV)
    trace = os.environ.get(CRASH_TRACE_ENV)
    if at or trace:
        _reached(name, at, trace)


def _reached(name: str, at: str | None, trace: str | None) -> None:
    if name not in _DECLARED:
        raise UndeclaredCrashPoint(f"crash point {name!r} is not declared")
    with _lock:  # files copy in threads: one count per arrival, one whole line each
        count = _counts.get(name, 0) + 1
        _counts[name] = count
        if trace:
            fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{name}#{count}\n".encode())
            finally:
                os.close(fd)
        if at in (name, f"{name}#{count}"):
            os.kill(os.getpid(), signal.SIGKILL)
