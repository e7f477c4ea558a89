"""The reading half of an import (DESIGN section 14): list the tree, tell its checkpoints
apart, and hand them over in stretches, each one batch for the writer to commit.

A stretch ends at a batch's worth of checkpoints, or every FLUSH_SECONDS once something is
settled, and carries the cursor its counts account for: every key at or before it. Between
stretches the listing may sit inside a checkpoint it has not finished gathering; those
objects are counted by the stretch that settles it, so a resumed import counts nothing
twice.

A local tree is read in a child process of its own (`scan_in_child`). Walking a directory
is a system call per file, each of which lets go of the GIL and must take it back; in the
process that also encodes each batch for the database, every taking back waited behind
the writer's Python, and the walk ran at half its speed. Apart, the walk has a core to
itself while this process writes, and the batches cross a pipe pickled. An object store
is read here, its pages arriving over the network: those waits let go of the GIL at no
cost, and the store's client (and any its tier was given) stays in this process.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import IO, Any, Literal

import orjson

from app.domain.layouts import (
    UNRECOGNIZED_SAMPLE,
    Candidate,
    Found,
    Incomplete,
    Recognizer,
    hf_metrics,
    run_name,
    run_segment,
)
from app.storage.base import ObjectInfo, Storage, file_entry, join_key
from app.storage.local import LocalStorage

log = logging.getLogger("app.imports")
BATCH = 1000  # checkpoints per transaction
FLUSH_SECONDS = 2.0  # a stretch ends at least this often once something is settled
TRAINER_STATE_LIMIT = 64 * 1024 * 1024  # a trainer_state.json larger than this is not read
PIPE_BYTES = 4 * 1024 * 1024  # the child may run a few batches ahead of the writer
RENEW: Literal["renew"] = "renew"  # nothing settled for FLUSH_SECONDS: renew the lease
CLOCK_EVERY = 64  # objects between looks at the clock (each a call, a million of them)


@dataclass(frozen=True, slots=True)
class ScanJob:
    """What a listing needs, and all a child process is told (as JSON)."""

    uri: str  # the tree's uri: candidates' uris and run names derive from it
    key: str  # the tree's key under its tier ("" for the tier's root)
    layout: str
    run: str | None  # one run for the whole tree, or None: named from the paths
    cursor: str | None  # list after this key (a resumed import)
    local_root: str | None = None  # a local tier's directory (what a child lists)


@dataclass(slots=True)
class Stretch:
    """What the listing found since the last stretch, up to `cursor`."""

    batch: list[Candidate] = field(default_factory=list)
    incomplete: list[tuple[str, str]] = field(default_factory=list)
    unrecognized_keys: list[str] = field(default_factory=list)
    # Trainer checkpoints' metrics by position in the batch, on an object store: the result
    # of a read already under way (a local file's are read as it is found)
    reads: list[tuple[int, Callable[[], dict[str, float]]]] = field(default_factory=list)
    cursor: str | None = None
    listed: int = 0  # objects at or before `cursor` not counted by an earlier stretch
    discovered: int = 0
    unrecognized: int = 0

    def with_metrics(self) -> list[Candidate]:
        """The batch with each Trainer checkpoint's metrics, waiting for any read still
        under way (they were sent off as each checkpoint was found)."""
        for position, metrics in self.reads:
            self.batch[position].metrics.update(metrics())
        self.reads.clear()
        return self.batch


Piece = Stretch | Literal["renew"]


def scan(storage: Storage, job: ScanJob, pool: ThreadPoolExecutor | None = None) -> Iterator[Piece]:
    """The tree's stretches in key order, and RENEW when FLUSH_SECONDS pass with nothing
    settled (one checkpoint of very many objects). `pool` reads Trainer state files while
    the listing goes on; without one they are read as found."""
    recognizer: Recognizer[ObjectInfo] = Recognizer(
        job.layout, keep_unrecognized=UNRECOGNIZED_SAMPLE
    )
    naming = _Naming(job.uri, job.run)
    current = Stretch()
    counted = 0  # of recognizer.unrecognized, in the stretches so far
    cursor = job.cursor
    settled, settled_listed = cursor, 0  # what the next stretch may claim as done
    previous: str | None = None
    flushed = time.monotonic()

    def settle(results: Sequence[Found[ObjectInfo] | Incomplete]) -> None:
        for result in results:
            if isinstance(result, Incomplete):
                current.incomplete.append((result.key, result.reason))
                continue
            current.discovered += 1
            candidate = _candidate(naming, result)
            if result.layout == "hf":  # found only with its trainer_state.json (the marker)
                state = join_key(join_key(job.key, result.key), "trainer_state.json")
                read = partial(_trainer_metrics, storage, state, result.step)
                if pool is None:
                    candidate.metrics.update(read())
                else:
                    current.reads.append((len(current.batch), pool.submit(read).result))
            current.batch.append(candidate)

    def cut(at: str | None, listed: int) -> Stretch:
        """The stretch up to `at`, with the unrecognized keys the recognizer counted so far
        (each settled as it came: none lies after `at`)."""
        nonlocal current, flushed, counted
        current.unrecognized += recognizer.unrecognized - counted
        counted = recognizer.unrecognized
        current.unrecognized_keys.extend(recognizer.unrecognized_keys)
        recognizer.unrecognized_keys.clear()
        done, current = current, Stretch(listed=current.listed - listed)
        done.cursor, done.listed = at, listed
        flushed = time.monotonic()
        return done

    add, monotonic = recognizer.add, time.monotonic
    # The checkpoint being gathered (Recognizer.gathering): its objects, most of a tree's,
    # are appended here without a call of `add` each (that call and the bookkeeping after
    # it were 0.5 s of the listing process's 3.9 s of Python at 957,050 objects)
    inside, length, append = "\0", 0, None
    for info in storage.iter_prefix(job.key, start_after=job.cursor):
        key = info[0]  # (the named field is a lookup more per object, a million of them)
        current.listed += 1
        if append is not None and key.startswith(inside):
            append((key[length:], info))  # settles nothing, opens nothing: `settled` holds
        else:
            settled_now = add(key, info)
            if settled_now:
                settle(settled_now)
            open_from = recognizer.open_from
            if open_from is None:
                settled, settled_listed = key, current.listed
            elif open_from == key and previous is not None:
                settled, settled_listed = previous, current.listed - 1
            inside, length, append = recognizer.gathering() or ("\0", 0, None)
        previous = key
        if len(current.batch) >= BATCH:
            yield cut(settled, settled_listed)
            cursor = settled
        elif current.listed % CLOCK_EVERY == 0 and monotonic() - flushed > FLUSH_SECONDS:
            if settled != cursor:
                yield cut(settled, settled_listed)
                cursor = settled
            else:
                flushed = monotonic()
                yield RENEW
    settle(recognizer.finish())
    yield cut(previous if previous is not None else cursor, current.listed)


# --- a local tree, read in a child process --------------------------------------------------


@contextlib.contextmanager
def scan_in_child(job: ScanJob, *, patience: float | None = None) -> Iterator[Iterator[Piece]]:
    """`scan` of a local tier's tree, run by `python -m app.services.lifecycle.import_scan`;
    the child is killed when the caller leaves (done, stopped or failed), and dies on its
    own when this process does (its next write finds the pipe closed).

    A child that sends nothing for `patience` seconds while this process waits for it
    (stopped for good, or stuck on a file system that stopped answering) is given up: the
    listing fails, naming it, instead of waiting for ever. The importer's patience is its
    lease: by then the lease has lapsed, and the import is another process's to take."""
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, json.dumps(asdict(job))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        close_fds=True,
    )
    assert proc.stdout is not None
    _widen(proc.stdout)
    pipe = io.BufferedReader(_PatientPipe(proc.stdout.fileno(), patience), PIPE_BYTES)
    try:
        yield _received(proc, pipe)
    finally:
        proc.kill()  # a stopped process too
        proc.wait()
        proc.stdout.close()


class ListingSilent(RuntimeError):
    """The listing process sent nothing for its patience."""

    def __init__(self, patience: float) -> None:
        super().__init__(
            f"the listing process sent nothing for {patience:g} s (stopped, or stuck on "
            "the file system) and was given up; import the tree again to go on"
        )


class _PatientPipe(io.RawIOBase):
    """The read end of the child's pipe, each read waiting `patience` seconds at most
    (None: for ever). Read through a buffer, so that an unpickling stalled mid-message
    gives up as one stalled between messages does. The descriptor stays the caller's."""

    def __init__(self, fd: int, patience: float | None) -> None:
        self.fd = fd
        self.patience = patience

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.patience is not None:
            ready, _, _ = select.select([self.fd], [], [], self.patience)
            if not ready:
                raise ListingSilent(self.patience)
        return os.readv(self.fd, [buffer])


def _received(proc: subprocess.Popen[bytes], pipe: IO[bytes]) -> Iterator[Piece]:
    while True:
        try:
            kind, value = pickle.load(pipe)
        except EOFError:
            code = proc.wait()
            raise RuntimeError(f"the listing process ended early (exit status {code})") from None
        if kind == "end":
            return
        if kind == "error":
            raise RuntimeError(value)
        yield value


def _widen(pipe: IO[bytes]) -> None:
    """A larger pipe, so the child goes on listing while a batch is written (Linux)."""
    with contextlib.suppress(AttributeError, OSError):
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _child(argv: list[str]) -> int:
    from app.logging import configure_logging

    configure_logging(os.environ.get("CKPT_LOG_LEVEL", "INFO").upper())
    job = ScanJob(**json.loads(argv[0]))
    assert job.local_root is not None
    out = sys.stdout.fileno()

    def send(message: tuple[str, Any]) -> None:
        _write_all(out, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    try:
        try:
            for piece in scan(LocalStorage(job.local_root), job):
                send(("piece", piece))
            send(("end", None))
        except BrokenPipeError:
            raise
        except Exception as error:  # reported to the import, where its caller looks
            log.exception("import listing failed")
            send(("error", str(error)))
    except BrokenPipeError:  # the importing process is gone: nobody to tell
        os.dup2(os.open(os.devnull, os.O_WRONLY), out)
        return 1
    return 0


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, however many writes the pipe takes. A write to a full pipe returns
    short when the writing process is stopped and continued (SIGSTOP, a frozen
    container, a debugger); pickled through the buffered `sys.stdout.buffer`, such a
    listing reached the importing process corrupt (reproduced: an import failed with
    an unpickling error), written this way it arrives whole."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- candidates -----------------------------------------------------------------------------


def _candidate(naming: _Naming, found: Found[ObjectInfo]) -> Candidate:
    files = []
    size = 0
    newest: datetime | None = None
    for name, info in found.files:  # one pass over a million objects, not three
        files.append(file_entry(name, info))
        size += info.size_bytes
        modified = info.modified
        if modified is not None and (newest is None or modified > newest):
            newest = modified
    run, run_uri = naming.run_of(found.run_path)
    return Candidate(
        key=found.key,
        run=run,
        run_uri=run_uri,
        step=found.step,
        uri=naming.uri_of(found.key),
        layout=found.layout,
        files=orjson.dumps(files),
        size_bytes=size,
        created_at=newest or datetime.now(UTC),
        metrics={},  # a Trainer's are read from its trainer_state.json
        single_file=found.single_file,
    )


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


def _trainer_metrics(storage: Storage, key: str, step: int) -> dict[str, float]:
    """A Trainer checkpoint's eval metrics at its step; none when the file cannot be read
    (the checkpoint is adopted all the same)."""
    try:
        parsed = _parsed(storage.read_small(key, TRAINER_STATE_LIMIT))
    except Exception:  # a torn, foreign or oversized file: the metrics are a courtesy
        log.warning("trainer_state.json unreadable", extra={"key": key}, exc_info=True)
        return {}
    return hf_metrics(parsed, step) if isinstance(parsed, dict) else {}


def _parsed(raw: bytes) -> Any:
    """JSON by orjson, a few times faster than the standard library on a long run's
    history; the standard library's for what orjson refuses: the NaN and Infinity that
    Python's json (the Trainer's) writes, as a diverged run's `best_metric`."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


if __name__ == "__main__":
    # through the module's own name, so that what is pickled names the classes the
    # importing process knows (not `__main__`'s)
    from app.services.lifecycle import import_scan

    sys.exit(import_scan._child(sys.argv[1:]))
