"""Writing a new checkpoint: its row, its primary location, its run's active totals, the
request to evaluate the run again, and its audit event.

On PostgreSQL this is one statement (data-modifying CTEs) on an autocommit connection:
atomic on its own, and one round trip instead of six (BEGIN, four writes, COMMIT),
which is most of what a registration costs. Elsewhere the four writes run in the
request's transaction.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Location
from app.domain.errors import NotFound
from app.services import audit
from app.services.upsert import insert_ignoring_conflicts
from app.services.usage import count_active

_PG_INSERT = """
    WITH c AS (
        INSERT INTO checkpoints (id, run_id, step, class, state, uri, size_bytes, files,
                                 metrics, labels, pinned, pin_reason, created_at,
                                 registered_at, committed_at, created_by, updated_by)
        VALUES (%(id)s, %(run_id)s, %(step)s, %(klass)s, %(state)s, %(uri)s,
                %(size_bytes)s, CAST(%(files)s AS JSON), CAST(%(metrics)s AS JSON),
                CAST(%(labels)s AS JSON), false, NULL, %(created_at)s, %(registered_at)s,
                %(committed_at)s, %(created_by)s, %(updated_by)s)
        ON CONFLICT DO NOTHING
        RETURNING id, run_id, size_bytes, state
    ), l AS (
        INSERT INTO locations (checkpoint_id, tier, uri, storage_class, role)
        SELECT id, %(tier)s, %(uri)s, %(storage_class)s, 'primary' FROM c
    ), u AS (
        UPDATE runs SET active_checkpoints = runs.active_checkpoints + 1,
                        active_bytes = runs.active_bytes + c.size_bytes,
                        evaluate_requested_at = COALESCE(runs.evaluate_requested_at,
                                                         %(registered_at)s)
        FROM c WHERE runs.id = c.run_id AND c.state = 'active'
    ), a AS (
        INSERT INTO audit_events (at, actor, entity, entity_id, event, checkpoint_id, run_id,
                                  "before", "after", reason)
        SELECT %(registered_at)s, %(created_by)s, 'checkpoint', id, %(audit_event)s, id,
               run_id, NULL, CAST(%(audit_after)s AS JSON), NULL FROM c
    )
    SELECT id FROM c
"""


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _audit_event(values: dict[str, Any], location: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`registered` (committed) or `reserved` (`writing`), and what the checkpoint is now."""
    after = {
        "state": values["state"],
        "step": values["step"],
        "class": values["klass"],
        "size_bytes": values["size_bytes"],
        "tier": location["tier"],
        "locations": [{"tier": location["tier"], "role": "primary", "uri": location["uri"]}],
    }
    return ("registered" if values["state"] == "active" else "reserved"), after


def insert_checkpoint(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    """Insert unless the run already has that step; returns whether it was inserted.
    Raises NotFound when the run does not exist."""
    try:
        if session.get_bind().dialect.name == "postgresql":
            return _insert_postgresql(session, values, location)
        return _insert_in_session(session, values, location)
    except IntegrityError:  # the only constraint left to break is the run's foreign key
        raise NotFound(f"no run has id {values['run_id']!r}", field="run_id") from None


def _insert_postgresql(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    event, after = _audit_event(values, location)
    params = {
        **values,
        "files": _json(values["files"]),
        "metrics": _json(values["metrics"]),
        "labels": _json(values["labels"]),
        "tier": location["tier"],
        "storage_class": location["storage_class"],
        "audit_event": event,
        "audit_after": _json(after),
    }
    if session.in_transaction():
        # The request already holds a connection: use it (commit comes with the request)
        # rather than take a second one from the pool.
        driver = session.connection().connection.driver_connection
        assert driver is not None
        return _execute(driver, params)
    engine = session.get_bind()
    assert isinstance(engine, Engine)
    raw = engine.raw_connection()  # the driver's own connection, from the pool
    try:
        driver = raw.driver_connection
        assert driver is not None
        driver.autocommit = True
        try:
            return _execute(driver, params)
        finally:
            driver.autocommit = False
    finally:
        raw.close()  # back to the pool


def _execute(driver: Any, params: dict[str, Any]) -> bool:
    try:
        with driver.cursor() as cursor:
            cursor.execute(_PG_INSERT, params)
            return cursor.fetchone() is not None
    except psycopg.errors.ForeignKeyViolation as error:
        raise IntegrityError(_PG_INSERT, params, error) from error


def _insert_in_session(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    row = {("class" if k == "klass" else k): v for k, v in values.items()}
    conn = session.connection()
    inserted = conn.execute(
        insert_ignoring_conflicts(session, Checkpoint)
        .values(row)
        .returning(Checkpoint.__table__.c.id)
    ).first()
    if inserted is None:
        return False
    conn.execute(insert_ignoring_conflicts(session, Location).values(location))
    if values["state"] == "active":
        count_active(
            session,
            values["run_id"],
            checkpoints=1,
            size=values["size_bytes"],
            evaluate_at=values["registered_at"],
        )
    event, after = _audit_event(values, location)
    change = audit.checkpoint_event(
        values["id"],
        values["run_id"],
        event,
        actor=values["created_by"],
        at=values["registered_at"],
        after=after,
    )
    audit.record_many(session, [change])
    return True
