"""The runs of an adopted tree, and what an adoption is (DESIGN section 14): the runs a
batch names are found or created (`completed` unless the import says `active`, named
after the directory they came from in their label `import_path`), and the checkpoints
registered into them fold into their totals and stretch an ended run's span."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, select, update
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts, one_of
from app.db.models import Project, Run
from app.domain.ids import new_id
from app.domain.layouts import Candidate
from app.domain.states import RunStatus
from app.domain.tier import Tier
from app.services.catalog import audit
from app.services.catalog.run_totals import add_active

LABEL_LIMIT = 256  # a label value's length
IN_CHUNK = 900  # bound parameters per IN list (SQLite allows 32,766 in a statement)


@dataclass(frozen=True, slots=True)
class Adoption:
    """What every batch of one import shares."""

    import_id: str
    project: str
    klass: str
    tier: Tier
    active: bool  # the runs it creates stay `active` (a training still running)
    dry_run: bool
    actor: str


def chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), IN_CHUNK):
        yield values[start : start + IN_CHUNK]


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str | None  # None: a dry run's run that does not exist yet
    status: str
    started_at: datetime | None
    ended_at: datetime | None


def ensure_runs(
    session: Session, adoption: Adoption, batch: Sequence[Candidate], now: datetime
) -> dict[str, RunRow]:
    """The batch's runs by name, created (completed unless the import says `active`)
    where missing; a dry run creates nothing."""
    project_id = _project_id(session, adoption, now)
    names = sorted({c.run for c in batch})
    found = _select_runs(session, project_id, names)
    missing = [name for name in names if name not in found]
    if adoption.dry_run or not missing:
        return {name: found.get(name, RunRow(None, "", None, None)) for name in names}
    status = RunStatus.ACTIVE if adoption.active else RunStatus.COMPLETED
    rows: list[dict[str, Any]] = []
    for name in missing:
        mine = [c for c in batch if c.run == name]
        rows.append(
            {
                "id": new_id("run"),
                "project_id": project_id,
                "name": name,
                "status": status,
                "labels": {"import_path": mine[0].run_uri[:LABEL_LIMIT]},
                "policy": None,
                "resumed_from": None,
                "started_at": min(c.created_at for c in mine),
                "ended_at": None if adoption.active else max(c.created_at for c in mine),
                "created_by": adoption.actor,
                "updated_by": adoption.actor,
            }
        )
    session.execute(insert_ignoring_conflicts(session, Run), rows)
    found = _select_runs(session, project_id, names)
    created = [row for row in rows if found[row["name"]].id == row["id"]]
    audit.record_many(
        session,
        [
            audit.new_event(
                actor=adoption.actor,
                entity="run",
                entity_id=row["id"],
                event="created",
                at=now,
                run_id=row["id"],
                after={
                    "project": adoption.project,
                    "name": row["name"],
                    "status": row["status"],
                    "labels": row["labels"],
                    "policy": None,
                },
                reason=f"adopted by import {adoption.import_id}",
            )
            for row in created
        ],
    )
    return found


def _project_id(session: Session, adoption: Adoption, now: datetime) -> int | None:
    if not adoption.dry_run:
        stmt = insert_ignoring_conflicts(session, Project).values(
            name=adoption.project, created_at=now
        )
        session.execute(stmt)
    return session.execute(
        select(Project.id).where(Project.name == adoption.project)
    ).scalar_one_or_none()


def _select_runs(session: Session, project_id: int | None, names: list[str]) -> dict[str, RunRow]:
    if project_id is None:
        return {}
    found: dict[str, RunRow] = {}
    for chunk in chunks(names):
        rows = session.execute(
            select(Run.name, Run.id, Run.status, Run.started_at, Run.ended_at).where(
                Run.project_id == project_id, one_of(Run.name, session, list(chunk))
            )
        )
        for name, run_id, status, started, ended in rows:
            found[name] = RunRow(run_id, status, started, ended)
    return found


def fold_into_runs(
    session: Session,
    rows: list[dict[str, Any]],
    runs: dict[str, RunRow],
) -> None:
    """Active totals of every run, and an ended run's span stretched over its adopted
    checkpoints (an active run keeps no end). No evaluation is asked for here: the
    import evaluates its project once it is whole (app.services.lifecycle.importer)."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(row)
    names = {row.id: name for name, row in runs.items()}
    runs_table = cast(Table, Run.__table__)
    for run_id, mine in by_run.items():
        add_active(session, run_id, checkpoints=len(mine), size=sum(r["size_bytes"] for r in mine))
        run = runs[names[run_id]]
        if run.ended_at is None:
            continue
        oldest = min(r["created_at"] for r in mine)
        newest = max(r["created_at"] for r in mine)
        values: dict[str, Any] = {}
        if run.started_at is not None and oldest < run.started_at:
            values["started_at"] = oldest
        if newest > run.ended_at:
            values["ended_at"] = newest
        if values:
            session.connection().execute(
                update(runs_table).where(runs_table.c.id == run_id).values(values)
            )
