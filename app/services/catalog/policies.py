"""Policies: validated once, stored in the database so every replica runs one set."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts
from app.db.models import PolicyRow
from app.domain.access import POLICY_FILES_ACTOR
from app.domain.errors import NotFound
from app.policy.loading import describe, resolve, to_document
from app.policy.schema import Policy
from app.services.catalog import audit
from app.services.catalog.due_runs import mark_all

log = logging.getLogger("app.policies")


def store_policy(
    session: Session,
    policy: Policy,
    *,
    source: str,
    now: datetime,
    actor: str = POLICY_FILES_ACTOR,
) -> PolicyRow:
    """Insert or replace the policy of that name, recording `actor` (by default the loader
    of the policy files). Idempotent, and safe when several replicas load the same files at
    the same moment: the insert ignores a conflict, and the replacement locks the row it
    compares, so a change is audited once and a file loaded again unchanged not at all."""
    document = to_document(policy)
    values = {
        "name": policy.name,
        "document": document,
        "source": source,
        "updated_at": now,
        "updated_by": actor,
    }
    inserted = session.execute(
        insert_ignoring_conflicts(session, PolicyRow)
        .values(**values)
        .returning(PolicyRow.__table__.c.name)
    ).first()
    row = session.execute(
        select(PolicyRow)
        .where(PolicyRow.name == policy.name)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if inserted is not None:
        _audit(
            session, row.name, "created", actor, now, None, {"document": document, "source": source}
        )
        mark_all(session, now)  # a new policy may govern any run
        return row
    before = {"document": row.document}
    row.document, row.source, row.updated_at, row.updated_by = document, source, now, actor
    session.flush()
    if before["document"] != document:
        _audit(session, row.name, "updated", actor, now, before, {"document": document})
        mark_all(session, now)
    return row


def _audit(
    session: Session,
    name: str,
    event: str,
    actor: str,
    now: datetime,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    audit.record(
        session,
        actor=actor,
        entity="policy",
        entity_id=name,
        event=event,
        at=now,
        before=before,
        after=after,
    )


def get_policy_row(session: Session, name: str) -> PolicyRow:
    row = session.get(PolicyRow, name)
    if row is None:
        raise NotFound(f"no policy is named {name!r}", field="name")
    return row


def list_policy_rows(session: Session) -> list[PolicyRow]:
    return list(session.execute(select(PolicyRow).order_by(PolicyRow.name)).scalars())


def delete_policy(session: Session, name: str, *, actor: str, now: datetime | None = None) -> None:
    """The row goes; the audit trail keeps what it was and who removed it."""
    row = get_policy_row(session, name)
    before = {"document": row.document, "source": row.source}
    session.delete(row)
    session.flush()
    at = now or datetime.now(UTC)
    _audit(session, name, "deleted", actor, at, before, None)
    mark_all(session, at)
    log.info("policy deleted", extra={"policy": name, "actor": actor})


# Evaluations run per registration: validate each stored version of a policy once.
_validated: dict[tuple[str, datetime, tuple[str, ...]], Policy] = {}


def active_policies(session: Session, tiers: list[str]) -> list[Policy]:
    """Every stored policy that still validates against today's tiers; one that no longer
    does (a tier was removed) is never run."""
    policies = []
    rows = session.execute(select(PolicyRow.name, PolicyRow.updated_at)).all()
    for name, updated_at in rows:
        key = (name, updated_at, tuple(tiers))
        cached = _validated.get(key)
        if cached is not None:
            policies.append(cached)
            continue
        row = session.get(PolicyRow, name)
        if row is None:
            continue
        try:
            policy = Policy.model_validate(row.document, context={"tiers": tiers})
            if len(_validated) > 1000:  # old versions of edited policies
                _validated.clear()
            _validated[key] = policy
            policies.append(policy)
        except ValidationError as error:
            log.error(
                "stored policy no longer validates; it is not run",
                extra={"policy": row.name, "error": describe(error, row.document)[1]},
            )
    return policies


def resolve_policy(
    session: Session | None,
    tiers: list[str],
    policy: str | Mapping[str, Any],
    *,
    message_names_field: bool = True,
) -> Policy:
    """A stored policy by name, or an inline document (app.policy.loading.resolve); without
    a session only inline documents resolve."""
    stored = None if session is None else (lambda name: get_policy_row(session, name).document)
    return resolve(policy, tiers, stored, message_names_field=message_names_field)
