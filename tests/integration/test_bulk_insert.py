"""Thousands of rows in one statement (app.db.bulk): what is read back is what was given,
whichever way the rows travelled (COPY, unnest with a conflict skipped, SQLite's
executemany), text that COPY's own format must escape and JSON included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Table, select
from sqlalchemy.orm import Session

from app.db.bulk import bulk_insert
from app.db.models import AuditEvent, Checkpoint, Project, Run

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
# what COPY's text format escapes (tab, newline, carriage return, backslash), its NULL
# marker as text, its end-of-data line, and what JSON must escape in its turn
AWKWARD = ["tab\there", "new\nline", "cr\rlf", "back\\slash", "\\N", "\\.", "quote \" ' ", "ü €"]


def _event(n: int, text: str) -> dict[str, Any]:
    return {
        "at": NOW + timedelta(seconds=n),
        "actor": f"token:{text}",
        "entity": "checkpoint",
        "entity_id": f"ckpt_{n}",
        "event": "registered",
        "checkpoint_id": None,
        "run_id": f"run_{n}",
        "before": None,  # SQL NULL, not JSON null
        "after": {"text": text, "nested": [text, {"n": n, "none": None, "yes": True}]},
        "reason": text,
    }


def test_rows_read_back_as_given_whatever_they_hold(clean_engine: Engine) -> None:
    rows = [_event(n, text) for n, text in enumerate(AWKWARD * 250)]  # 2,000 rows
    with Session(clean_engine) as session:
        assert bulk_insert(session, cast(Table, AuditEvent.__table__), rows) == []
        session.commit()
        found = session.scalars(select(AuditEvent).order_by(AuditEvent.at)).all()
        got = [
            {
                "at": e.at,
                "actor": e.actor,
                "entity": e.entity,
                "entity_id": e.entity_id,
                "event": e.event,
                "checkpoint_id": e.checkpoint_id,
                "run_id": e.run_id,
                "before": e.before,
                "after": e.after,
                "reason": e.reason,
            }
            for e in found
        ]
    assert got == rows


def test_nothing_to_insert_writes_nothing(clean_engine: Engine) -> None:
    with Session(clean_engine) as session:
        assert bulk_insert(session, cast(Table, AuditEvent.__table__), []) == []
        session.commit()
        assert session.scalars(select(AuditEvent)).all() == []


def test_a_failed_bulk_insert_leaves_nothing_of_its_rows(clean_engine: Engine) -> None:
    """One row that breaks a constraint fails the whole statement; the rolled-back
    transaction holds none of the others."""
    rows = [_event(n, "fine") for n in range(10)]
    rows[7]["entity"] = None  # NOT NULL
    with Session(clean_engine) as session:
        with pytest.raises(Exception, match=r"(?i)null"):
            bulk_insert(session, cast(Table, AuditEvent.__table__), rows)
        session.rollback()
        assert session.scalars(select(AuditEvent)).all() == []


def test_conflicting_rows_are_skipped_and_only_the_inserted_returned(
    clean_engine: Engine,
) -> None:
    with Session(clean_engine) as session:
        project = Project(name="p", created_at=NOW)
        session.add(project)
        session.flush()
        session.add(Run(id="run_a", project_id=project.id, name="a", started_at=NOW))
        session.commit()

        def checkpoint(n: int) -> dict[str, Any]:
            return {
                "id": f"ckpt_{n}",
                "run_id": "run_a",
                "step": n,
                "class": "milestone",
                "state": "active",
                "uri": f"file:///t/{AWKWARD[n % len(AWKWARD)]}/{n}",
                "size_bytes": n,
                "files": [{"path": AWKWARD[n % len(AWKWARD)], "size_bytes": n}],
                "metrics": {},
                "labels": {},
                "pinned": False,
                "single_file": False,
                "created_at": NOW,
                "registered_at": NOW,
                "committed_at": NOW,
                "created_by": "admin",
                "updated_by": "admin",
            }

        table = cast(Table, Checkpoint.__table__)
        first = bulk_insert(
            session, table, [checkpoint(n) for n in range(5)], ignore_conflicts=True, returning="id"
        )
        again = bulk_insert(
            session,
            table,
            [checkpoint(n) for n in range(3, 8)],  # 3 and 4 are there already
            ignore_conflicts=True,
            returning="id",
        )
        session.commit()
        assert sorted(first) == [f"ckpt_{n}" for n in range(5)]
        assert sorted(again) == [f"ckpt_{n}" for n in range(5, 8)]
        # the rows of the batch that met a conflict went in once each, and nothing else
        assert sorted(session.scalars(select(Checkpoint.id))) == [f"ckpt_{n}" for n in range(8)]
        files = {i: f for i, f in session.execute(select(Checkpoint.id, Checkpoint.files))}
        assert files["ckpt_6"] == [{"path": AWKWARD[6], "size_bytes": 6}]
