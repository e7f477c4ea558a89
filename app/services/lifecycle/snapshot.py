"""Read the catalog into the engine's plain data, in a few set-based queries.

This is the hot half of a full sweep (a million rows), so it runs Core statements on
the session's connection and builds the snapshots straight from the rows.
"""

from __future__ import annotations

import gc
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, func, null, select
from sqlalchemy.orm import Session

from app.db.dialect import fetch_all
from app.db.models import Checkpoint, Location, Project, Run
from app.db.streaming import stream_rows
from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.domain.states import CheckpointState, RunStatus
from app.policy.schema import Policy
from app.services.catalog.runs import runs_in

# A range of run ids, from the first (inclusive) to the second (exclusive); None is open.
RunRange = tuple[str | None, str | None]

STREAM_FROM_RUNS = 100  # runs in scope from which a plan reads its checkpoints streamed


@dataclass
class Scope:
    """What one evaluation looks at."""

    runs: list[RunSnapshot]
    checkpoints: dict[str, list[CheckpointSnapshot]]  # run id -> active checkpoints
    resumed_by_active: set[str]


def ranked_by(policies: Iterable[Policy]) -> set[str]:
    """The metrics the policies' keep_best clauses rank checkpoints by: all a plan reads."""
    return {r.keep_best.metric for p in policies for r in p.rules if r.keep_best is not None}


class _CollectorPause:
    """The cyclic collector off while any caller holds a pause, back as it was when the last
    lets go: concurrent plans (threads of one process) each pause it, and the first to
    finish must not turn it on under the others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    def hold(self) -> Callable[[], None]:
        """Pause it; returns the release, which only its first call performs."""
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()

        return release


_COLLECTOR = _CollectorPause()


def pause_gc() -> Callable[[], None]:
    """A full plan allocates millions of long-lived objects; the cyclic collector would
    rescan them all again and again while they are built, and once more each time it runs
    while they live. Nothing a plan builds makes cycles: they are freed by reference
    counting. Call the returned function to let the collector run again."""
    return _COLLECTOR.hold()


@contextmanager
def gc_paused() -> Iterator[None]:
    """`pause_gc` for a block."""
    release = pause_gc()
    try:
        yield
    finally:
        release()


def restrict(
    stmt: Select,  # type: ignore[type-arg]
    project: str | None,
    run_id: str | None,
    projects: Collection[str] | None = None,
    run_ids: Collection[str] | None = None,
    between: RunRange | None = None,
) -> Select:  # type: ignore[type-arg]
    """`stmt` (over checkpoints) narrowed to the scope; `between`, one part of a plan
    split by runs, narrows it further."""
    if between is not None:
        stmt = in_range(stmt, Checkpoint.run_id, between)
    if run_ids is not None:
        return stmt.where(Checkpoint.run_id.in_(sorted(run_ids)))
    if run_id is not None:
        return stmt.where(Checkpoint.run_id == run_id)
    if project is not None:
        return stmt.where(Checkpoint.run_id.in_(runs_in([project])))
    if projects is not None:
        return stmt.where(Checkpoint.run_id.in_(runs_in(projects)))
    return stmt


def in_range(stmt: Select, column: Any, between: RunRange) -> Select:  # type: ignore[type-arg]
    """Run ids from the first (inclusive) to the second (exclusive); None is open."""
    low, high = between
    if low is not None:
        stmt = stmt.where(column >= low)
    if high is not None:
        stmt = stmt.where(column < high)
    return stmt


def of_projects(
    stmt: Select,  # type: ignore[type-arg]
    project: str | None,
    projects: Collection[str] | None,
) -> Select:  # type: ignore[type-arg]
    """`stmt` (over runs joined to their project) narrowed to one project, or to those of
    `projects`; the first wins, as everywhere a scope is given."""
    if project is not None:
        return stmt.where(Project.name == project)
    if projects is not None:
        return stmt.where(Project.name.in_(sorted(projects)))
    return stmt


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes from a raw Core row; the catalog stores UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def run_select() -> Select:  # type: ignore[type-arg]
    """The runs as the engine reads them (read_runs builds their snapshots)."""
    return select(
        Run.id,
        Project.name,
        Run.name,
        Run.status,
        Run.labels,
        Run.policy,
        Run.resumed_from,
        Run.ended_at,
        Run.next_due_at,
    ).join(Project, Project.id == Run.project_id)


def read_runs(session: Session, stmt: Select, *, many: bool) -> list[RunSnapshot]:  # type: ignore[type-arg]
    """The snapshots of the runs a narrowed run_select() finds."""
    return [
        RunSnapshot(
            id=r[0],
            project=r[1],
            name=r[2],
            status=r[3],
            labels=r[4] or {},
            policy=r[5],
            resumed_from=r[6],
            ended_at=r[7],
            next_due_at=_utc(r[8]),
        )
        for r in fetch_all(session, stmt, many=many)
    ]


def load_scope(
    session: Session,
    *,
    project: str | None = None,
    run_id: str | None = None,
    projects: Collection[str] | None = None,
    run_ids: Collection[str] | None = None,
    metrics: Collection[str] | None = None,
    between: RunRange | None = None,
) -> Scope:
    """Runs in scope (one run, one project, the projects of `projects`, or the whole catalog;
    the narrowest given wins) with their active
    checkpoints, and the checkpoints of the scope that active runs resumed from.

    With `metrics` (the names the policies rank by), each checkpoint carries only those,
    read as numbers by the database: parsing every checkpoint's JSON took more than half of
    a million-checkpoint plan. `between` narrows the scope to a range of run ids (one part
    of a plan split across processes, app.services.lifecycle.plan_helpers)."""
    many = run_id is None  # one run's rows are few
    run_stmt = run_select()
    if between is not None:
        run_stmt = in_range(run_stmt, Run.id, between)
    if run_ids is not None:  # the runs a periodic sweep found due
        run_stmt = run_stmt.where(Run.id.in_(sorted(run_ids)))
    elif run_id is not None:
        run_stmt = run_stmt.where(Run.id == run_id)
    else:
        run_stmt = of_projects(run_stmt, project, projects)
    runs = read_runs(session, run_stmt, many=many)
    names = sorted(metrics or ())
    # The primary tier is on the checkpoint's row (models.Checkpoint.tier): joining every
    # primary location cost a 1M plan 1.3 s of PostgreSQL's CPU, and a lookup per
    # checkpoint a sweep of a few runs. A row without it (inserted by the previous release
    # while this one rolls out) is read through its primary: COALESCE runs the lookup for
    # those rows alone.
    primary = (
        select(Location.tier)
        .where(Location.checkpoint_id == Checkpoint.id, Location.role == "primary")
        .order_by(Location.id)
        .limit(1)
        .scalar_subquery()
    )
    ckpt_select = select(
        Checkpoint.id,
        Checkpoint.run_id,
        Checkpoint.step,
        Checkpoint.klass,
        Checkpoint.size_bytes,
        Checkpoint.created_at,
        Checkpoint.pinned,
        func.coalesce(Checkpoint.tier, primary),
        Checkpoint.protected_until,
        *(
            [Checkpoint.metrics]
            if metrics is None
            else [Checkpoint.metrics[name].as_float() for name in names] or [null()]
        ),
    )
    ckpt_stmt = restrict(
        ckpt_select.where(Checkpoint.state == CheckpointState.ACTIVE),
        project,
        run_id,
        projects,
        run_ids,
        between,
    )
    replica_stmt = restrict(
        select(Location.checkpoint_id, Location.tier)
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(Location.role == "replica", Checkpoint.state == CheckpointState.ACTIVE),
        project,
        run_id,
        projects,
        run_ids,
        between,
    )
    replicas: dict[str, set[str]] = defaultdict(set)
    for checkpoint_id, tier in fetch_all(session, replica_stmt, many=many):
        replicas[checkpoint_id].add(tier)
    by_run: dict[str, list[CheckpointSnapshot]] = defaultdict(list)
    single: dict[str | None, frozenset[str]] = {}  # one frozenset per tier, shared
    # A run's id, a class and a tier arrive as a new string in every row: each is kept
    # once (and the row's copy freed with its batch), as is one empty metrics mapping.
    shared: dict[str, str] = {}
    none = CheckpointSnapshot._field_defaults["metrics"]
    # tuple.__new__ rather than the namedtuple's own constructor: a million of them
    new, snapshot = tuple.__new__, CheckpointSnapshot
    only = names[0] if len(names) == 1 else None  # the common case: one metric
    several = metrics is not None and len(names) > 1
    # Read a batch ahead when the scope is large (a server-side cursor costs a few round
    # trips more, about a millisecond, than one fetch of a small scope's rows).
    batches = (
        stream_rows(session, ckpt_stmt)
        if len(runs) >= STREAM_FROM_RUNS
        else [fetch_all(session, ckpt_stmt, many=many)]
    )
    for rows in batches:
        for row in rows:
            if several:
                cid, rid, step, klass, size, created, pinned, tier, protected = row[:9]
                found = {n: v for n, v in zip(names, row[9:]) if v is not None} or none  # noqa: B905
            else:  # one column more: the metrics, the one ranked by, or none (a NULL)
                cid, rid, step, klass, size, created, pinned, tier, protected, value = row
                if value is None:
                    found = none
                elif only is None:
                    found = value or none
                else:
                    found = {only: value}
            rid = shared.setdefault(rid, rid)
            klass = shared.setdefault(klass, klass)
            if tier is not None:
                tier = shared.setdefault(tier, tier)
            extra = replicas.get(cid)
            if extra:
                held = frozenset((tier, *extra))
            else:
                held = single.get(tier) or single.setdefault(
                    tier, frozenset((tier,)) if tier else frozenset()
                )
            by_run[rid].append(
                new(
                    snapshot,
                    (
                        cid,
                        rid,
                        step,
                        klass,
                        "active",
                        size,
                        created,
                        tier,
                        held,
                        found,
                        pinned,
                        protected if protected is None else _utc(protected),
                    ),
                )
            )
    resumed_stmt = select(Run.resumed_from).where(
        Run.status == RunStatus.ACTIVE, Run.resumed_from.is_not(None)
    )
    narrowed = (run_id, project, projects, run_ids, between)
    if any(n is not None for n in narrowed):
        in_scope = restrict(select(Checkpoint.id), project, run_id, projects, run_ids, between)
        resumed_stmt = resumed_stmt.where(Run.resumed_from.in_(in_scope))
    resumed = {cid for (cid,) in fetch_all(session, resumed_stmt, many=many) if cid is not None}
    return Scope(
        runs=runs,
        checkpoints=dict(by_run),
        resumed_by_active=resumed,
    )
