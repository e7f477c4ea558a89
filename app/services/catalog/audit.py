"""The audit trail: who changed a checkpoint, run, policy, token or action, when, from what
to what, and why.

Events are written in the caller's session, in the transaction of the change they
describe, so an event exists exactly when its change commits (a rolled-back request leaves
none). Each write is one Core INSERT, executed at once: the trail's ids follow the order in
which the changes were made, and the hot paths (registration, sweeps) pay one statement.

`before`/`after` hold only the fields that changed, never a secret nor a secret's hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from app.db.bulk import bulk_insert
from app.db.models import Action, AuditEvent, Location, NewAction
from app.db.pagination import BadCursor, decode_cursor, encode_cursor
from app.domain.access import SCHEDULER_ACTOR, rule_actor

Entity = Literal["checkpoint", "run", "policy", "token", "action"]
MAX_ID = 2**63 - 1  # ids are BIGINT on PostgreSQL


def jsonable(value: Any) -> Any:
    """Timestamps as ISO 8601 UTC strings, the way the API writes them, on both databases."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def new_event(
    *,
    actor: str,
    entity: Entity,
    entity_id: str,
    event: str,
    at: datetime | None = None,
    checkpoint_id: str | None = None,
    run_id: str | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """One event as the row to insert (`record_many` takes a list of them)."""
    return {
        "at": at or datetime.now(UTC),
        "actor": actor,
        "entity": entity,
        "entity_id": entity_id,
        "event": event,
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "before": jsonable(before) if before is not None else None,
        "after": jsonable(after) if after is not None else None,
        "reason": reason,
    }


def record(
    session: Session,
    *,
    actor: str,
    entity: Entity,
    entity_id: str,
    event: str,
    at: datetime | None = None,
    checkpoint_id: str | None = None,
    run_id: str | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    reason: str | None = None,
) -> None:
    """Record one change in the session's transaction."""
    record_many(
        session,
        [
            new_event(
                actor=actor,
                entity=entity,
                entity_id=entity_id,
                event=event,
                at=at,
                checkpoint_id=checkpoint_id,
                run_id=run_id,
                before=before,
                after=after,
                reason=reason,
            )
        ],
    )


def checkpoint_event(
    checkpoint_id: str,
    run_id: str,
    event: str,
    *,
    actor: str,
    at: datetime,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """A change of one checkpoint, filed under it and under its run."""
    return new_event(
        actor=actor,
        entity="checkpoint",
        entity_id=checkpoint_id,
        event=event,
        at=at,
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        before=before,
        after=after,
        reason=reason,
    )


def record_many(session: Session, events: Sequence[dict[str, Any]]) -> None:
    """Record many changes in one statement (a sweep's actions, a bulk approval): on
    PostgreSQL one array per column (bulk_insert), which keeps the trail's ids in the
    events' order as a multi-row INSERT does."""
    if len(events) > 1:
        bulk_insert(session, cast(Table, AuditEvent.__table__), events)
    elif events:
        session.execute(insert(AuditEvent), list(events))


# --- what the callers put in an event -------------------------------------------------------


def diff(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields whose value differs, as (before, after); both empty when nothing changed."""
    keys = [k for k in after if before.get(k) != after[k]]
    return {k: before.get(k) for k in keys}, {k: after[k] for k in keys}


def locations(rows: Iterable[Location]) -> list[dict[str, Any]]:
    """Where a checkpoint's bytes are, primary first."""
    ordered = sorted(rows, key=lambda loc: (loc.role != "primary", loc.tier))
    return [{"tier": loc.tier, "role": loc.role, "uri": loc.uri} for loc in ordered]


def placement(rows: Iterable[Location]) -> dict[str, Any]:
    """The primary tier and every location: what a move, copy, restore or purge changes."""
    where = locations(rows)
    primary = next((loc["tier"] for loc in where if loc["role"] == "primary"), None)
    return {"tier": primary, "locations": where}


def acting_as(actor: str | None, rule: str) -> str:
    """Who a change made by executing an action is recorded as: whoever asked for it (a
    token) or the rule that planned it, like the catalog's `updated_by`. Actions written
    before actors were recorded fall back to their rule, or the scheduler for `manual`."""
    if actor:
        return actor
    return rule_actor(rule) if rule != "manual" else SCHEDULER_ACTOR


def action_actor(action: Action | NewAction) -> str:
    return acting_as(action.actor, action.rule)


def action_event(
    action: Action | NewAction,
    event_name: str,
    *,
    at: datetime,
    actor: str | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event of the action itself; its reason is always the action's rule."""
    return new_event(
        actor=actor or action_actor(action),
        entity="action",
        entity_id=action.id,
        event=event_name,
        at=at,
        checkpoint_id=action.checkpoint_id,
        run_id=action.run_id,
        before=before,
        after=after,
        reason=action.rule,
    )


def action_created(
    action: Action | NewAction, *, at: datetime, actor: str | None = None
) -> dict[str, Any]:
    """A new action: what it will do, why (its reason text), and from which sweep."""
    after = {
        "kind": action.kind,
        "state": action.state,
        "from_tier": action.from_tier,
        "to_tier": action.to_tier,
        "bytes": action.bytes,
        "reason": action.reason,
        "due_at": action.due_at,
    }
    if action.sweep_id is not None:
        after["sweep_id"] = action.sweep_id
    return action_event(action, "created", at=at, actor=actor, after=after)


# --- reading the trail ----------------------------------------------------------------------


def list_events(
    session: Session,
    *,
    checkpoint_id: str | None,
    run_id: str | None,
    actor: str | None,
    since: datetime | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[AuditEvent], str | None]:
    """Oldest first, keyset on id: a page never repeats nor skips an event while others
    are being written. `actor` ending in `*` matches every actor with that prefix."""
    if any(v is not None and "\x00" in v for v in (checkpoint_id, run_id, actor)):
        return [], None  # no value holds one, and PostgreSQL refuses it as a parameter
    stmt = select(AuditEvent).order_by(AuditEvent.id).limit(limit + 1)
    for column, value in ((AuditEvent.checkpoint_id, checkpoint_id), (AuditEvent.run_id, run_id)):
        if value is not None:
            stmt = stmt.where(column == value)
    if actor is not None:
        if actor.endswith("*"):
            stmt = stmt.where(AuditEvent.actor.startswith(actor[:-1], autoescape=True))
        else:
            stmt = stmt.where(AuditEvent.actor == actor)
    if since is not None:
        stmt = stmt.where(AuditEvent.at >= since)
    if cursor is not None:
        (last,) = decode_cursor(cursor, int)
        if isinstance(last, bool) or not 0 <= last <= MAX_ID:
            raise BadCursor("not a cursor this list handed out", field="cursor")
        stmt = stmt.where(AuditEvent.id > last)
    rows = list(session.execute(stmt).scalars())
    page = rows[:limit]
    return page, encode_cursor(page[-1].id) if len(rows) > limit else None
