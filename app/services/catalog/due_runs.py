"""Which runs the periodic sweep evaluates: those whose plan may have changed.

A run's `next_due_at` is the next instant its plan can change by the clock (app.policy.due),
written by each evaluation of the run; anything else that may change a plan sets it to the
moment it happened: an action that finished (a move puts the checkpoint on another tier, a
failure is planned again later), a policy edit (every run), a restart (tiers and policy
files may differ). Registrations, commits, pins and status changes ask for the run's own
evaluation (`evaluate_requested_at`), which writes its next due time as any evaluation does.

An evaluation writes the new time only where `next_due_at` still holds what the evaluation
read with the run: an event marking the run meanwhile wins, and the next sweep sees it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session

from app.db.models import Run

# "Never by the clock alone": later than any threshold a policy can name.
NEVER = datetime(9999, 1, 1, tzinfo=UTC)


def due_run_ids(session: Session, now: datetime) -> list[str]:
    """Runs to evaluate at `now`: never evaluated, marked, or a threshold reached."""
    stmt = select(Run.id).where(or_(Run.next_due_at.is_(None), Run.next_due_at <= now))
    return list(session.scalars(stmt))


def mark_changed(session: Session, run_id: str, at: datetime) -> None:
    """Something that may change the run's plan happened `at`: due at the next sweep."""
    session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(next_due_at=at)
        .execution_options(synchronize_session=False)
    )


def mark_all(session: Session, at: datetime) -> None:
    """Every run due (a policy edit, a restart): the next sweep is a full one."""
    session.execute(update(Run).values(next_due_at=at).execution_options(synchronize_session=False))


def record_next_due(
    session: Session, evaluated: Iterable[tuple[str, datetime | None, datetime | None]]
) -> None:
    """(run id, next_due_at as read, next change found) of each run evaluated: write the
    change found (NEVER for none) where nothing marked the run since it was read.

    The guard is `IS NOT DISTINCT FROM`, which no index serves, rather than `=`, so that
    the primary key alone finds the row. Many runs share one next_due_at (NEVER, or the
    instant of the sweep that last wrote them), and on statistics taken before a sweep
    wrote them PostgreSQL read the value's whole entry in ix_runs_next_due_at instead: at
    10,000 runs this statement took 2 ms of a registration's 15 ms evaluation, and it grew
    with the runs that share the value. It also matches a run never evaluated (NULL)."""
    rows: list[dict[str, object]] = [
        {"rid": run_id, "seen": seen, "due": found or NEVER} for run_id, seen, found in evaluated
    ]
    if not rows:
        return
    table = Run.metadata.tables["runs"]
    session.execute(
        update(table)
        .where(
            table.c.id == bindparam("rid"),
            table.c.next_due_at.is_not_distinct_from(bindparam("seen")),
        )
        .values(next_due_at=bindparam("due")),
        _params(rows),
    )


def _params(rows: list[dict[str, object]]) -> list[dict[str, object]] | dict[str, object]:
    """One row as one execute: psycopg's executemany costs a pipeline's set-up and sync,
    a few milliseconds in a registration's evaluation of its one run."""
    return rows[0] if len(rows) == 1 else rows
