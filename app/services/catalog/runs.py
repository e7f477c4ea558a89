"""Use cases for runs: idempotent create, list, update."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts
from app.db.models import Checkpoint, Project, Run
from app.db.pagination import BadCursor, decode_cursor, encode_cursor
from app.domain.errors import Invalid, NotFound
from app.domain.ids import new_id
from app.domain.states import RunStatus
from app.services.catalog import audit


@dataclass(frozen=True, slots=True)
class RunView:
    run: Run
    project: str


def _project_id(session: Session, name: str, now: datetime) -> int:
    stmt = insert_ignoring_conflicts(session, Project).values(name=name, created_at=now)
    session.execute(stmt)
    return session.execute(select(Project.id).where(Project.name == name)).scalar_one()


def _unstorable(value: str) -> bool:
    """No id holds a NUL, and PostgreSQL refuses one in a query parameter: treat as unknown."""
    return "\x00" in value


def _check_resumed_from(
    session: Session, checkpoint_id: str | None, projects: Collection[str] | None
) -> None:
    """The checkpoint must exist, and lie in `projects` (when given): a run's `resumed_from`
    protects that checkpoint, which a bounded token must not do outside its projects."""
    if checkpoint_id is None:
        return
    row = (
        None
        if _unstorable(checkpoint_id)
        else session.execute(
            select(Project.name)
            .join(Run, Run.project_id == Project.id)
            .join(Checkpoint, Checkpoint.run_id == Run.id)
            .where(Checkpoint.id == checkpoint_id)
        ).one_or_none()
    )
    if row is None or (projects is not None and row[0] not in projects):
        raise NotFound(f"no checkpoint has id {checkpoint_id!r}", field="resumed_from")


def create_run(
    session: Session,
    *,
    project: str,
    name: str,
    labels: dict[str, str],
    policy: str | None,
    resumed_from: str | None,
    actor: str,
    now: datetime,
    started_at: datetime | None = None,
    projects: Collection[str] | None = None,
) -> tuple[RunView, bool]:
    """Create the run, or return the existing one of that project and name (created=False).
    `started_at` back-dates an adopted run (now when None). `projects` bounds the
    checkpoints `resumed_from` may name (None: any)."""
    project_id = _project_id(session, project, now)
    existing = session.execute(
        select(Run).where(Run.project_id == project_id, Run.name == name)
    ).scalar_one_or_none()
    if existing is not None:
        return RunView(existing, project), False
    _check_resumed_from(session, resumed_from, projects)
    run_id = new_id("run")
    stmt = insert_ignoring_conflicts(session, Run).values(
        id=run_id,
        project_id=project_id,
        name=name,
        status=RunStatus.ACTIVE,
        labels=labels,
        policy=policy,
        resumed_from=resumed_from,
        started_at=started_at or now,
        created_by=actor,
        updated_by=actor,
    )
    session.execute(stmt)
    run = session.execute(
        select(Run).where(Run.project_id == project_id, Run.name == name)
    ).scalar_one()
    created = run.id == run_id
    if created:  # not when a concurrent request created it first
        audit.record(
            session,
            actor=actor,
            entity="run",
            entity_id=run.id,
            event="created",
            at=now,
            run_id=run.id,
            after={"project": project, "name": name, **_audited(run)},
        )
    return RunView(run, project), created


def _audited(run: Run) -> dict[str, Any]:
    """The fields of a run that a PATCH changes."""
    return {
        "status": run.status,
        "labels": dict(run.labels),
        "policy": run.policy,
        "resumed_from": run.resumed_from,
        "ended_at": run.ended_at,
    }


def get_run(session: Session, run_id: str) -> RunView:
    row = (
        None
        if _unstorable(run_id)
        else session.execute(
            select(Run, Project.name).join(Project).where(Run.id == run_id)
        ).one_or_none()
    )
    if row is None:
        raise NotFound(f"no run has id {run_id!r}", field="run_id")
    return RunView(row[0], row[1])


def list_runs(
    session: Session,
    *,
    project: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    labels: Collection[tuple[str, str]] = (),
    projects: Collection[str] | None = None,
) -> tuple[list[RunView], str | None]:
    """Newest run first; only runs of `projects` when given (a bounded caller's), and only
    runs carrying every (key, value) of `labels`."""
    stmt = select(Run, Project.name).join(Project).order_by(Run.id.desc()).limit(limit + 1)
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if projects is not None:
        stmt = stmt.where(Project.name.in_(sorted(projects)))
    if status is not None:
        stmt = stmt.where(Run.status == status)
    for key, value in labels:
        stmt = stmt.where(Run.labels[key].as_string() == value)
    if cursor is not None:
        (last_id,) = decode_cursor(cursor, str)
        if _unstorable(last_id):
            raise BadCursor("not a cursor this list handed out", field="cursor")
        stmt = stmt.where(Run.id < last_id)
    rows = session.execute(stmt).all()
    views = [RunView(run, name) for run, name in rows[:limit]]
    next_cursor = encode_cursor(views[-1].run.id) if len(rows) > limit else None
    return views, next_cursor


def update_run(
    session: Session,
    *,
    run_id: str,
    changes: dict[str, Any],
    actor: str,
    now: datetime,
    projects: Collection[str] | None = None,
) -> RunView:
    """Apply a PATCH. Ending a run stamps `ended_at` (now unless given); reopening clears it.
    `projects` bounds the checkpoints `resumed_from` may name (None: any)."""
    view = get_run(session, run_id)
    run = view.run
    was = _audited(run)
    if "resumed_from" in changes:
        _check_resumed_from(session, changes["resumed_from"], projects)
    status = changes.get("status") or run.status
    if "ended_at" in changes and changes["ended_at"] is not None and status == RunStatus.ACTIVE:
        raise Invalid(
            "an active run has no end: set status to completed or failed", field="ended_at"
        )
    for key in ("labels", "policy", "resumed_from"):
        if key in changes:
            if key == "labels" and changes[key] is None:
                raise Invalid("must be an object of strings", field="labels")
            setattr(run, key, changes[key])
    if "status" in changes and changes["status"] is None:
        raise Invalid("must be one of active, completed, failed", field="status")
    ended_at = changes.get("ended_at")
    if ended_at is not None and ended_at < run.started_at:
        raise Invalid(
            f"the run started at {run.started_at.isoformat()}: it cannot end before that",
            field="ended_at",
        )
    if status == RunStatus.ACTIVE:
        run.ended_at = None
    elif changes.get("ended_at") is not None:
        run.ended_at = changes["ended_at"]
    elif run.status == RunStatus.ACTIVE or run.ended_at is None:
        run.ended_at = max(now, run.started_at)  # a given start may lie ahead of this clock
    run.status = status
    run.updated_by = actor
    run.evaluate_requested_at = run.evaluate_requested_at or now
    before, after = audit.diff(was, _audited(run))
    if after:
        audit.record(
            session,
            actor=actor,
            entity="run",
            entity_id=run.id,
            event="updated",
            at=now,
            run_id=run.id,
            before=before,
            after=after,
        )
    session.flush()
    return view


def resolve_scope(
    session: Session, *, project: str | None, run_id: str | None
) -> tuple[str | None, str | None]:
    """The (project, run_id) a plan or sweep covers, checked to exist: a scope that names
    nothing would answer an empty plan that reads as "nothing to do". A run given with its
    own project is just that run. Raises NotFound naming `project` or `run_id`."""
    if run_id is not None:
        view = get_run(session, run_id)
        if project is not None and view.project != project:
            raise NotFound(f"project {project!r} has no run {run_id!r}", field="run_id")
        return None, run_id
    if project is not None and (
        _unstorable(project)
        or session.execute(select(Project.id).where(Project.name == project)).first() is None
    ):
        raise NotFound(f"no project is named {project!r}", field="project")
    return project, None


def runs_in(projects: Collection[str]) -> Select[str]:
    """The ids of the runs of `projects`: what a caller bounded to some projects may see
    (tokens scoped to projects; a `project=` filter is one project)."""
    return select(Run.id).join(Project).where(Project.name.in_(sorted(projects)))
