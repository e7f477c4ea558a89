"""Per-run totals of active checkpoints, kept in step with every change of state."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from app.db.models import Project, Run


def add_active(
    session: Session,
    run_id: str,
    *,
    checkpoints: int,
    size: int,
    request_evaluation_at: datetime | None = None,
) -> None:
    """Add (or with negative values remove) checkpoints to a run's active totals, and with
    `request_evaluation_at` also ask for the run's evaluation (in the same statement: a
    registration pays one round trip for both). Call it in the transaction that changes
    the checkpoints' state."""
    runs = cast(Table, Run.__table__)
    values: dict[str, Any] = {
        "active_checkpoints": runs.c.active_checkpoints + checkpoints,
        "active_bytes": runs.c.active_bytes + size,
    }
    if request_evaluation_at is not None:
        values["evaluate_requested_at"] = func.coalesce(
            runs.c.evaluate_requested_at, request_evaluation_at
        )
    # Core, not ORM: no identity-map synchronisation to pay for
    session.connection().execute(update(runs).where(runs.c.id == run_id).values(values))


def project_totals(session: Session, projects: Collection[str]) -> dict[str, tuple[int, int]]:
    """project name -> (count, bytes) of its active checkpoints, across all its runs."""
    if not projects:
        return {}
    rows = session.execute(
        select(
            Project.name,
            func.coalesce(func.sum(Run.active_checkpoints), 0),
            func.coalesce(func.sum(Run.active_bytes), 0),
        )
        .join(Run, Run.project_id == Project.id)
        .where(Project.name.in_(list(projects)))
        .group_by(Project.name)
    ).all()
    return {name: (int(count), int(size)) for name, count, size in rows}
