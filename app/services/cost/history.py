"""The catalog's history, read for a backtest (app.cost.backtest): the runs a candidate
policy would govern, their checkpoints, the events a candidate replays, and the changes of
bytes per tier that actually happened.

Everything comes from rows the service keeps anyway: runs (`started_at`, `ended_at`,
`resumed_from`), checkpoints (`created_at`, `committed_at`), the ledger (a person's
deletes and restores) and the audit trail (where a checkpoint was written, pins and
unpins, undeletes, and every move, copy, restore and purge that changed where its bytes
are). Two passes over the trail, each ordered by id, read only the columns they use.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from sqlalchemy import ColumnElement, and_, select, true
from sqlalchemy.orm import Session

from app.cost.backtest import (
    APPEARED,
    DELETED,
    PINNED,
    RESTORED,
    RUN_ENDED,
    RUN_STARTED,
    UNDELETED,
    UNPINNED,
    CheckpointFacts,
    Delta,
    Event,
)
from app.db.models import Action, AuditEvent, Checkpoint, Project, Run
from app.domain.plan import RunSnapshot
from app.policy.engine import applies
from app.policy.schema import Policy
from app.services.lifecycle.snapshot import read_runs, run_select

WRITTEN = ("registered", "reserved")  # the first event of a checkpoint: where it was written
PLACED = ("moved", "copied", "restored", "purged")  # its locations changed (purged: none)
PERSON = {"pinned": PINNED, "unpinned": UNPINNED, "undeleted": UNDELETED}


@dataclass(frozen=True, slots=True)
class History:
    runs: list[RunSnapshot]
    checkpoints: list[CheckpointFacts]
    events: list[Event]
    actual: list[Delta]  # what was stored, as it changed
    first: datetime | None  # the earliest event


def load_history(
    session: Session,
    policy: Policy,
    *,
    project: str | None,
    run_id: str | None,
    projects: Collection[str] | None,
) -> History:
    """The history of the runs in scope that `policy`'s `applies_to` selects (priorities
    and a run's own `policy` aside: the question is what the candidate would do to the runs
    it names)."""
    scope = _scope(project, run_id, projects)
    found = read_runs(session, run_select().where(scope).order_by(Run.id), many=True)
    runs = [r for r in found if applies(policy, r)]
    wanted = {r.id for r in runs}
    ranked = sorted({r.keep_best.metric for r in policy.rules if r.keep_best is not None})
    written = _written(session, scope)
    checkpoints: list[CheckpointFacts] = []
    appeared: dict[str, datetime | None] = {}
    for f, committed_at in _checkpoints(session, scope, wanted, ranked):
        if f.id not in written:
            continue  # written before the trail recorded where: nothing to replay it from
        tier, how = written[f.id]
        checkpoints.append(replace(f, tier=tier))
        # a registration at its `created_at`; a reservation when (if ever) it committed
        appeared[f.id] = f.created_at if how == "registered" else committed_at
    known = {c.id: c for c in checkpoints}
    events: list[Event] = []
    starts = {r.id: r.started_at for r in _started(session, scope) if r.id in wanted}
    for c in checkpoints:  # a run starts no later than its first checkpoint
        at = appeared[c.id]
        if at is not None and at < starts[c.run_id]:
            starts[c.run_id] = at
    for r in runs:
        events.append(Event(starts[r.id], RUN_STARTED, r.id))
        if r.status != "active" and r.ended_at is not None:
            events.append(Event(r.ended_at, RUN_ENDED, r.id))
    for c in checkpoints:
        at = appeared[c.id]
        if at is not None:
            events.append(Event(at, APPEARED, c.run_id, c.id))
    actual, purged = _actual(session, scope, known, appeared)
    events += _person_events(session, scope, known, purged)
    first = min((e.at for e in events), default=None)
    return History(runs, checkpoints, events, actual, first)


@dataclass(frozen=True, slots=True)
class _Started:
    id: str
    started_at: datetime


def _scope(
    project: str | None, run_id: str | None, projects: Collection[str] | None
) -> ColumnElement[bool]:
    conditions: list[ColumnElement[bool]] = [true()]
    if project is not None:
        conditions.append(Project.name == project)
    if projects is not None:
        conditions.append(Project.name.in_(sorted(projects)))
    if run_id is not None:
        conditions.append(Run.id == run_id)
    return and_(*conditions)


def _started(session: Session, scope: ColumnElement[bool]) -> list[_Started]:
    query = select(Run.id, Run.started_at).join(Project, Project.id == Run.project_id)
    return [_Started(i, at) for i, at in session.execute(query.where(scope))]


def _joined(query: Any) -> Any:
    return query.join(Run, Run.id == Checkpoint.run_id).join(Project, Project.id == Run.project_id)


def _checkpoints(
    session: Session, scope: ColumnElement[bool], runs: set[str], ranked: Sequence[str]
) -> list[tuple[CheckpointFacts, datetime | None]]:
    """Every checkpoint of the runs (its tier left blank), with its `committed_at`."""
    columns: list[Any] = [
        Checkpoint.id,
        Checkpoint.run_id,
        Checkpoint.step,
        Checkpoint.klass,
        Checkpoint.size_bytes,
        Checkpoint.created_at,
        Checkpoint.committed_at,
    ]
    if ranked:
        columns.append(Checkpoint.metrics)
    found: list[tuple[CheckpointFacts, datetime | None]] = []
    for row in session.execute(_joined(select(*columns)).where(scope)):
        if row[1] not in runs:
            continue
        metrics: dict[str, float] = {}
        if ranked and row[7]:
            metrics = {m: float(row[7][m]) for m in ranked if row[7].get(m) is not None}
        facts = CheckpointFacts(
            row[0], row[1], row[2], row[3], row[4], row[5], "", MappingProxyType(metrics)
        )
        found.append((facts, row[6]))
    return found


def _events(session: Session, scope: ColumnElement[bool], names: Sequence[str]) -> Any:
    query = (
        select(AuditEvent.checkpoint_id, AuditEvent.event, AuditEvent.at, AuditEvent.after)
        .join(Run, Run.id == AuditEvent.run_id)
        .join(Project, Project.id == Run.project_id)
        .where(scope, AuditEvent.entity == "checkpoint", AuditEvent.event.in_(names))
        .order_by(AuditEvent.id)
    )
    return session.execute(query)


def _written(session: Session, scope: ColumnElement[bool]) -> dict[str, tuple[str, str]]:
    """Each checkpoint's tier when it was written, and whether it was registered committed
    or reserved: its first event says."""
    found: dict[str, tuple[str, str]] = {}
    for checkpoint_id, event, _, after in _events(session, scope, WRITTEN):
        if checkpoint_id not in found and after and after.get("tier"):
            found[checkpoint_id] = (after["tier"], event)
    return found


def _actual(
    session: Session,
    scope: ColumnElement[bool],
    known: dict[str, CheckpointFacts],
    appeared: dict[str, datetime | None],
) -> tuple[list[Delta], dict[str, datetime]]:
    """What each checkpoint stored where, as it changed: from when it appeared on the tier
    it was written to, through every move, copy and restore, to its purge. Also returns
    when each purged checkpoint's bytes went."""
    deltas: list[Delta] = []
    where: dict[str, frozenset[str]] = {}
    for c in known.values():
        at = appeared.get(c.id)
        if at is not None:
            where[c.id] = frozenset({c.tier})
            deltas.append(Delta(at, c.tier, c.size_bytes))
    purged: dict[str, datetime] = {}
    for checkpoint_id, event, at, after in _events(session, scope, PLACED):
        placed = known.get(checkpoint_id)
        if placed is None or checkpoint_id not in where or not after or "locations" not in after:
            continue
        size = placed.size_bytes
        now = frozenset(loc["tier"] for loc in after["locations"])
        was = where[checkpoint_id]
        deltas += [Delta(at, t, -size) for t in sorted(was - now)]
        deltas += [Delta(at, t, size) for t in sorted(now - was)]
        where[checkpoint_id] = now
        if event == "purged":
            purged[checkpoint_id] = at
    return deltas, purged


def _person_events(
    session: Session,
    scope: ColumnElement[bool],
    known: dict[str, CheckpointFacts],
    purged: dict[str, datetime],
) -> list[Event]:
    """Pins, unpins and undeletes (the trail), a person's deletes and every restore (the
    ledger): what the candidate does not decide but lives with."""
    events: list[Event] = []
    for checkpoint_id, event, at, _ in _events(session, scope, tuple(PERSON)):
        c = known.get(checkpoint_id)
        if c is not None:
            events.append(Event(at, PERSON[event], c.run_id, c.id))
    query = (
        select(Action.checkpoint_id, Action.kind, Action.finished_at, Action.to_tier)
        .join(Run, Run.id == Action.run_id)
        .join(Project, Project.id == Run.project_id)
        .where(scope, Action.state == "done")
        .where(((Action.kind == "delete") & (Action.rule == "manual")) | (Action.kind == "restore"))
    )
    for checkpoint_id, kind, at, to_tier in session.execute(query):
        c = known.get(checkpoint_id)
        if c is None or at is None:
            continue
        if kind == "delete":
            events.append(Event(at, DELETED, c.run_id, c.id, purged_at=purged.get(c.id)))
        else:
            events.append(Event(at, RESTORED, c.run_id, c.id, tier=to_tier))
    return events
