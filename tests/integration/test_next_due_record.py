"""An evaluation writes when each run it evaluated is due again, unless something marked the
run after the evaluation read it (app.services.catalog.due_runs.record_next_due)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session

from app.db.models import Project, Run
from app.services.catalog.due_runs import NEVER, mark_changed, record_next_due

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _runs(session: Session, due: list[datetime | None]) -> list[str]:
    project = Project(name="p", created_at=NOW)
    session.add(project)
    session.flush()
    ids = [f"run_{n:020d}" for n in range(len(due))]
    session.add_all(
        Run(id=i, project_id=project.id, name=i, started_at=NOW, next_due_at=d)
        for i, d in zip(ids, due, strict=True)
    )
    session.commit()
    return ids


def _due(session: Session, run_id: str) -> datetime | None:
    return session.scalar(select(Run.next_due_at).where(Run.id == run_id))


def test_each_run_gets_its_next_change_unless_it_was_marked_since_it_was_read(
    clean_engine: Engine,
) -> None:
    later = NOW + timedelta(days=3)
    with Session(clean_engine) as session:
        never_evaluated, unchanged, marked, settled = _runs(session, [None, NOW, NOW, NOW])
        mark_changed(session, marked, NOW + timedelta(minutes=1))  # after the evaluation read it
        session.commit()
        record_next_due(
            session,
            [
                (never_evaluated, None, later),
                (unchanged, NOW, later),
                (marked, NOW, later),
                (settled, NOW, None),  # nothing can change its plan by the clock
            ],
        )
        session.commit()
        assert _due(session, never_evaluated) == later
        assert _due(session, unchanged) == later
        assert _due(session, marked) == NOW + timedelta(minutes=1)  # the mark wins
        assert _due(session, settled) == NEVER


def test_one_run_evaluated_alone_is_written_as_well(clean_engine: Engine) -> None:
    """A registration's evaluation of its one run (one execute, not a batch)."""
    with Session(clean_engine) as session:
        (run_id,) = _runs(session, [None])
        record_next_due(session, [(run_id, None, NOW)])
        session.commit()
        assert _due(session, run_id) == NOW
        record_next_due(session, [(run_id, NOW - timedelta(days=1), NOW + timedelta(days=1))])
        session.commit()
        assert _due(session, run_id) == NOW  # read before the write above: it lost


def test_postgresql_finds_the_row_by_its_key_whatever_runs_share_the_time(
    clean_engine: Engine,
) -> None:
    """Many runs share one next_due_at (NEVER, or one sweep's instant). Analyzed before a
    sweep wrote them, PostgreSQL took that value for a rare one and read its whole entry in
    ix_runs_next_due_at for a one-row update; the guard must leave only the key to use."""
    if clean_engine.dialect.name != "postgresql":
        return  # SQLite's planner has no statistics that could mislead it here
    sent: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.startswith("UPDATE runs"):
            sent.append((statement, parameters))

    with Session(clean_engine) as session:
        ids = _runs(session, [None] * 3000)
        session.execute(text("ANALYZE runs"))  # every next_due_at NULL, as before a sweep
        record_next_due(session, [(i, None, None) for i in ids])  # all NEVER now
        session.commit()
        event.listen(clean_engine, "before_cursor_execute", keep)
        try:
            record_next_due(session, [(ids[7], NEVER, NOW)])  # a registration's evaluation
        finally:
            event.remove(clean_engine, "before_cursor_execute", keep)
        ((statement, parameters),) = sent
        plan = session.connection().exec_driver_sql("EXPLAIN " + statement, parameters)
        lines = "\n".join(row[0] for row in plan)
        assert "pk_runs" in lines and "ix_runs_next_due_at" not in lines, lines
        session.commit()
        assert _due(session, ids[7]) == NOW
