"""Writing a new checkpoint: its row, its primary location, its run's active totals, the
request to evaluate the run again, and its audit event.

On PostgreSQL this is one statement (data-modifying CTEs) on an autocommit connection:
atomic on its own, and one round trip instead of six (BEGIN, four writes, COMMIT),
which is most of what a registration costs. Elsewhere the four writes run in the
request's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts, on_postgresql
from app.db.models import Checkpoint, Location
from app.domain.errors import Conflict, NotFound
from app.services.catalog import audit
from app.services.catalog.overlap import Overlap, ancestors, refuse_overlap
from app.services.catalog.run_totals import add_active

# `o` is the overlap check (app.services.catalog.overlap.find_overlap, in SQL, two index range scans
# that a prepared generic plan keeps): a live location of another checkpoint equal to the
# uri, above it or under it stops the insert.
_PG_INSERT = """
    WITH o AS (
        SELECT m.checkpoint_id, m.uri FROM (
            SELECT id, checkpoint_id, uri FROM locations WHERE uri = ANY(%(ancestors)s)
            UNION ALL
            SELECT id, checkpoint_id, uri FROM locations
            WHERE uri ~>=~ %(below_low)s AND uri ~<~ %(below_high)s
        ) m
        JOIN checkpoints k ON k.id = m.checkpoint_id
        WHERE k.state IN ('writing', 'active', 'trashed')
          AND NOT (k.run_id = %(run_id)s AND k.step = %(step)s)
        ORDER BY m.id LIMIT 1
    ), c AS (
        INSERT INTO checkpoints (id, run_id, step, class, state, uri, size_bytes, files,
                                 metrics, labels, pinned, pin_reason, single_file, created_at,
                                 registered_at, committed_at, created_by, updated_by,
                                 reserved_until, tier)
        SELECT CAST(%(id)s AS VARCHAR), CAST(%(run_id)s AS VARCHAR), CAST(%(step)s AS BIGINT),
               CAST(%(klass)s AS VARCHAR), CAST(%(state)s AS VARCHAR), CAST(%(uri)s AS TEXT),
               CAST(%(size_bytes)s AS BIGINT), CAST(%(files)s AS JSON),
               CAST(%(metrics)s AS JSON), CAST(%(labels)s AS JSON), false, NULL,
               CAST(%(single_file)s AS BOOLEAN), CAST(%(created_at)s AS TIMESTAMPTZ),
               CAST(%(registered_at)s AS TIMESTAMPTZ), CAST(%(committed_at)s AS TIMESTAMPTZ),
               CAST(%(created_by)s AS VARCHAR), CAST(%(updated_by)s AS VARCHAR),
               CAST(%(reserved_until)s AS TIMESTAMPTZ), CAST(%(tier)s AS VARCHAR)
        WHERE NOT EXISTS (SELECT 1 FROM o){guard}
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
    SELECT (SELECT id FROM c), (SELECT checkpoint_id FROM o), (SELECT uri FROM o)
"""
# A caller whose token the process has looked up before: still live, and allowed on the
# run's project, checked by the insert itself (a token is revoked at once; its scopes and
# projects never change), so such a registration is one round trip.
_CALLER_GUARD = """
          AND EXISTS (SELECT 1 FROM tokens t WHERE t.id = %(token_id)s AND t.revoked_at IS NULL)
          AND EXISTS (SELECT 1 FROM runs r JOIN projects p ON p.id = r.project_id
                      WHERE r.id = %(run_id)s
                        AND (%(any_project)s OR p.name = ANY(%(projects)s)))"""
_PG_INSERT_GUARDED = _PG_INSERT.replace("{guard}", _CALLER_GUARD)
_PG_INSERT = _PG_INSERT.replace("{guard}", "")


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
    if values["reserved_until"] is not None:
        after["reserved_until"] = audit.jsonable(values["reserved_until"])
    return ("registered" if values["state"] == "active" else "reserved"), after


def insert_checkpoint(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    """Insert unless the run already has that step; returns whether it was inserted.
    Raises NotFound when the run does not exist, Conflict when the uri overlaps a live
    location of another checkpoint."""
    try:
        if on_postgresql(session):
            return _insert_postgresql(session, values, location)
        return _insert_in_session(session, values, location)
    except IntegrityError:  # the only constraint left to break is the run's foreign key
        raise NotFound(f"no run has id {values['run_id']!r}", field="run_id") from None


def _postgresql_params(values: dict[str, Any], location: dict[str, Any]) -> dict[str, Any]:
    event, after = _audit_event(values, location)
    return {
        **values,
        "files": _json(values["files"]),
        "metrics": _json(values["metrics"]),
        "labels": _json(values["labels"]),
        "tier": location["tier"],
        "storage_class": location["storage_class"],
        "audit_event": event,
        "audit_after": _json(after),
        "ancestors": ancestors(values["uri"]),
        "below_low": values["uri"].rstrip("/") + "/",
        "below_high": values["uri"].rstrip("/") + "0",
    }


def _insert_postgresql(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    params = _postgresql_params(values, location)
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
            row = cursor.fetchone()
    except psycopg.errors.ForeignKeyViolation as error:
        raise IntegrityError(_PG_INSERT, params, error) from error
    return _inserted(row, params)


@dataclass(frozen=True, slots=True)
class Caller:
    """A token the insert checks again: live, and allowed on the run's project."""

    token_id: str
    projects: frozenset[str] | None  # None: every project


async def insert_checkpoint_async(
    connection: psycopg.AsyncConnection[Any],
    values: dict[str, Any],
    location: dict[str, Any],
    caller: Caller | None = None,
) -> bool:
    """`insert_checkpoint` on PostgreSQL, on an autocommit connection of the event loop
    (app.api.fast_registration): the same statement, the same answers. With `caller`, it
    inserts nothing (False) unless that token is live and allowed on the run's project."""
    params = _postgresql_params(values, location)
    sql = _PG_INSERT
    if caller is not None:
        sql = _PG_INSERT_GUARDED
        params["token_id"] = caller.token_id
        params["any_project"] = caller.projects is None
        params["projects"] = sorted(caller.projects or ())
    try:
        cursor = await connection.execute(sql, params)
        row = await cursor.fetchone()
    except psycopg.errors.ForeignKeyViolation:
        raise NotFound(f"no run has id {values['run_id']!r}", field="run_id") from None
    return _inserted(row, params)


def _inserted(row: Any, params: dict[str, Any]) -> bool:
    """Whether the statement inserted; Conflict when the uri overlapped another's."""
    inserted, other, other_uri = row
    if other is not None:
        found = Overlap(other, other_uri)
        raise Conflict(found.describe(params["uri"]), field="uri", checkpoint_id=other)
    return inserted is not None


def _insert_in_session(session: Session, values: dict[str, Any], location: dict[str, Any]) -> bool:
    refuse_overlap(session, values["uri"], run_id=values["run_id"], step=values["step"])
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
        add_active(
            session,
            values["run_id"],
            checkpoints=1,
            size=values["size_bytes"],
            request_evaluation_at=values["registered_at"],
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
