"""A large plan evaluated by ranges of runs in several processes.

A whole catalog's plan is one interpreter's work: reading a million rows into snapshots
and running the engine over them hold the GIL, and on PostgreSQL that left every core
but about one idle while a replan after a policy edit or `POST /v1/plan` ran for seconds.
From SPLIT_FROM active checkpoints in scope, the runs are cut into ranges of about equal
checkpoint counts (CKPT_PLAN_PROCESSES of them); this process evaluates the first and
helper processes the others, each reading its own range over its own connection. The
blast-radius hold, which weighs a project's deletes across all its runs, is decided once
on the merged parts (app.services.lifecycle.planning), so a split plan is the plan.

Helpers are started (spawned, never forked from a threaded server) by the first plan
that needs them and live as long as this process; each serves one part at a time. A
range that finds no helper free, or whose helper failed, died or was not done in time
(HELPER_PATIENCE_S), is evaluated here: a split plan is never worse than the plan it
replaces. Only on PostgreSQL: the embedded SQLite catalog is meant for catalogs far
below the split's size.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pickle
import signal
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, sessionmaker

from app.db.dialect import on_postgresql
from app.db.models import Project, Run
from app.db.session import make_engine, make_session_factory
from app.services.lifecycle.plan_parts import (
    PlanInputs,
    PlanPart,
    encode_kept,
    evaluate_scope,
    loaded_by_project,
    merge_parts,
)
from app.services.lifecycle.snapshot import (
    RunRange,
    Scope,
    gc_paused,
    load_scope,
    of_projects,
)

log = logging.getLogger("app.plan")

SPLIT_FROM = 200_000  # active checkpoints in scope from which a plan is split
READY = b"ready"  # a helper's first message
# A helper's part of an explained plan (every kept checkpoint with its reasons, each
# action's costs) takes about a sixth of its evaluation again to hand over: encoded,
# pickled, sent and unpickled here (at 1M in two parts: 0.7 s after 4.0 s). This process
# encodes its own kept checkpoints meanwhile, and its range is made larger, in percent of
# a helper's, so that both end together (125 measured no better: what is left of the wait,
# 0.2-0.3 s, is the part's transfer). A sweep's plan hands over its actions alone (3 %):
# equal ranges.
EXPLAINED_FIRST_RANGE = 115
# A service starting on a large catalog waits this long at most for its helpers (they
# import what a part needs in about a second): its first plan then finds them ready.
WARM_WAIT_S = 10.0
# How long a plan waits for a helper's part once its own range is done: as long again as
# that range took, and never less than this. A helper that is not done by then (frozen,
# stopped, or on a machine far busier than its work) is killed and its range evaluated
# here: a sweep holds the evaluation lock, and no helper may keep cleanup waiting for ever.
HELPER_PATIENCE_S = 30.0


@dataclass(frozen=True)
class _Request:
    url: str  # the catalog's database, password included: it never leaves the machine
    inputs: PlanInputs
    between: RunRange
    project: str | None
    projects: Collection[str] | None
    metrics: Collection[str]


def _read_part(session: Session, request: _Request) -> tuple[PlanPart, Scope]:
    scope = load_scope(
        session,
        project=request.project,
        projects=request.projects,
        metrics=request.metrics,
        between=request.between,
    )
    part = evaluate_scope(request.inputs, scope)
    part.loaded = loaded_by_project(scope)
    return part, scope


def _serve(conn: Connection) -> None:
    """A helper's life: one request at a time until the parent closes its end. What it
    read is freed after its part is sent, off the plan's critical path."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    factories: dict[str, sessionmaker[Session]] = {}
    try:
        conn.send_bytes(READY)  # everything a part needs is imported by now
    except OSError:
        return
    while True:
        try:
            request: _Request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            with gc_paused():
                factory = factories.get(request.url)
                if factory is None:
                    factory = factories[request.url] = make_session_factory(
                        make_engine(request.url, pool_size=1)
                    )
                with factory() as session:
                    part, scope = _read_part(session, request)
                if request.inputs.kept_as_json:
                    encode_kept(part)
                conn.send(("ok", part))
        except (EOFError, OSError):
            return
        except Exception as error:  # reported to the parent, which plans the range itself
            conn.send(("error", f"{type(error).__name__}: {error}"))
            continue
        del part, scope


class _Helper:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child,), name="ckpt-plan-part", daemon=True
        )
        self.process.start()
        child.close()
        self._ready = False

    def wait_ready(self, timeout: float) -> bool:
        """Whether the helper said it is ready within `timeout` seconds."""
        if not self._ready and self._conn.poll(timeout):
            self._ready = self._conn.recv_bytes() == READY
        return self._ready

    def ask(self, request: _Request) -> _Reply:
        self._conn.send(request)
        reply = _Reply(self._conn, ready=self._ready)
        self._ready = True  # the reply reads the helper's first message if still pending
        return reply

    def stop(self) -> None:
        self._conn.close()  # the helper's recv ends: it returns
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class _Reply:
    """A part on its way: its bytes are read by a thread as the helper sends them (a pipe
    holds 64 KiB, and the helper would otherwise wait for this process to finish its own
    range before it could hand over its part)."""

    def __init__(self, conn: Connection, *, ready: bool) -> None:
        self._conn = conn
        self._ready = ready
        self._data: bytes | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name="ckpt-plan-reply", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self._data = self._conn.recv_bytes()
            if not self._ready and self._data == READY:  # a helper still starting
                self._data = self._conn.recv_bytes()
        except BaseException as error:  # handed to the waiting plan
            self._failure = error

    def wait_read(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the reading thread to end (a killed helper's
        pipe reads as ended)."""
        self._thread.join(timeout)

    def part(self, deadline: float) -> PlanPart:
        """The helper's part; raises OSError or EOFError when the helper died, TimeoutError
        (an OSError) when it is not in by `deadline` (time.monotonic), and RuntimeError when
        it failed to plan."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            raise TimeoutError("its part was not in by the deadline")
        if self._failure is not None:
            raise self._failure
        assert self._data is not None
        status, payload = pickle.loads(self._data)
        if status != "ok":
            raise RuntimeError(payload)
        part: PlanPart = payload
        return part


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.processes = 1
        self._idle: list[_Helper] = []
        self._busy = 0

    def borrow(self) -> _Helper | None:
        """An idle helper, a new one while fewer than processes - 1 live, else None."""
        with self._lock:
            if self._idle:
                self._busy += 1
                return self._idle.pop()
            if len(self._idle) + self._busy >= self.processes - 1:
                return None
            self._busy += 1
        try:
            return _Helper()
        except BaseException:
            with self._lock:
                self._busy -= 1
            raise

    def start_all(self) -> list[_Helper]:
        """Borrow every helper there can be, started if need be."""
        helpers = []
        while (helper := self.borrow()) is not None:
            helpers.append(helper)
        return helpers

    def return_all(self, helpers: list[_Helper]) -> None:
        for helper in helpers:
            self.give_back(helper, alive=True)

    def give_back(self, helper: _Helper, *, alive: bool) -> None:
        with self._lock:
            self._busy -= 1
            if alive and len(self._idle) + self._busy < self.processes - 1:
                self._idle.append(helper)
                return
        helper.stop()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for helper in idle:
            helper.stop()


_POOL = _Pool()


def warm(session: Session, *, wait: float = 0.0) -> int:
    """Start the helpers now if a plan of the whole catalog would be split (a service
    starting on a large catalog: its first plan then finds them ready); with `wait`, wait
    up to that many seconds for them to be. Returns how many are ready or starting."""
    if plan_ranges(session, project=None, projects=None) is None:
        return 0
    started = _POOL.start_all()
    for helper in started:
        helper.wait_ready(wait)
    _POOL.return_all(started)
    return len(started)


def configure(processes: int) -> None:
    """How many processes (this one included) a large plan is split across; 1: none."""
    if processes < 1:
        raise ValueError("a plan needs at least one process")
    _POOL.processes = processes


def shutdown() -> None:
    """Stop the idle helpers (a helper busy with a part stops when it is given back)."""
    _POOL.processes = 1
    _POOL.close()


def plan_ranges(
    session: Session,
    *,
    project: str | None,
    projects: Collection[str] | None,
    explained: bool = False,
) -> list[RunRange] | None:
    """The ranges of run ids a plan of this scope is split into, of about equal active
    checkpoint counts (the per-run totals kept on the run row), the first a little larger
    for an `explained` plan (EXPLAINED_FIRST_RANGE); None when it is not split. The
    database finds where each range starts (a window over the runs), so a catalog of a
    million small runs costs a scan of them there, not a million rows here."""
    parts = _POOL.processes
    if parts <= 1 or not on_postgresql(session.connection()):
        return None
    count = func.coalesce(Run.active_checkpoints, 0)

    def narrowed(stmt: Select) -> Select:  # type: ignore[type-arg]
        if project is None and projects is None:
            return stmt
        return of_projects(stmt.join(Project, Project.id == Run.project_id), project, projects)

    total = session.execute(narrowed(select(func.sum(count)))).scalar() or 0
    if total < max(SPLIT_FROM, 1):
        return None
    before = (func.sum(count).over(order_by=Run.id) - count).label("before")
    runs = narrowed(select(Run.id.label("id"), before)).subquery()
    first = EXPLAINED_FIRST_RANGE if explained else 100
    weights = first + 100 * (parts - 1)  # the ranges' sizes: first, then 100 each
    position = (runs.c.before * weights) // total  # 0 .. weights - 1
    # the range a run starts in: 0 .. parts - 1 (integer division truncates toward 0)
    share = func.greatest((position + 100 - first) // 100, 0)
    rows = session.execute(
        select(share, func.min(runs.c.id)).where(share > 0).group_by(share).order_by(share)
    ).all()
    starts: list[str | None] = [None, *(first for _, first in rows)]
    return list(zip(starts, [*starts[1:], None], strict=True))


def evaluate_in_parts(
    session: Session,
    inputs: PlanInputs,
    ranges: list[RunRange],
    *,
    project: str | None,
    projects: Collection[str] | None,
    metrics: Collection[str],
) -> tuple[Scope, PlanPart]:
    """The evaluation of every range, the first here and the others by helpers; returns
    this process's scope (the first range's) and the merged parts."""
    url = session.connection().engine.url.render_as_string(hide_password=False)
    asked: list[tuple[_Request, _Helper | None, _Reply | None]] = []
    for between in ranges[1:]:
        request = _Request(url, inputs, between, project, projects, sorted(metrics))
        helper = _POOL.borrow()
        reply = None
        if helper is not None:
            try:
                reply = helper.ask(request)
            except OSError as error:
                log.warning("plan helper gone", extra={"error": str(error)})
                _POOL.give_back(helper, alive=False)
                helper = None
        asked.append((request, helper, reply))
    started = time.monotonic()
    try:
        first = _Request(url, inputs, ranges[0], project, projects, sorted(metrics))
        part, scope = _read_part(session, first)
        if inputs.kept_as_json:  # while the helpers finish theirs, rather than after
            encode_kept(part)
        parts = [part]
    finally:
        now = time.monotonic()
        deadline = now + max(HELPER_PATIENCE_S, now - started)
        replies = [_collect(helper, reply, deadline) for _, helper, reply in asked]
    for (request, _, _), got in zip(asked, replies, strict=True):
        if got is None:  # no helper, or it failed: this process evaluates the range
            got, _read = _read_part(session, request)
            del _read
        parts.append(got)
    return scope, merge_parts(parts)


def _collect(helper: _Helper | None, reply: _Reply | None, deadline: float) -> PlanPart | None:
    if helper is None or reply is None:
        return None
    try:
        part = reply.part(deadline)
    except TimeoutError:
        log.warning("plan helper too slow", extra={"pid": helper.process.pid})
        helper.process.kill()  # stopped or frozen: its end of the pipe closes with it
        reply.wait_read(5.0)  # the reader sees the end before the pipe is closed here
        with contextlib.suppress(OSError):
            _POOL.give_back(helper, alive=False)
        return None
    except (EOFError, OSError) as error:
        log.warning("plan helper gone", extra={"error": str(error) or type(error).__name__})
        with contextlib.suppress(OSError):
            _POOL.give_back(helper, alive=False)
        return None
    except Exception as error:  # it failed to plan, or its part did not unpickle
        log.warning("plan helper failed", extra={"error": f"{type(error).__name__}: {error}"})
        _POOL.give_back(helper, alive=True)
        return None
    _POOL.give_back(helper, alive=True)
    return part
