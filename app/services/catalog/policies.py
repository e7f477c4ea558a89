"""Policies: validated once, stored in the database so every replica runs one set."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts
from app.db.models import PolicyRow
from app.domain.access import POLICY_FILES_ACTOR
from app.domain.errors import Invalid, NotFound
from app.policy.schema import Policy
from app.services.catalog import audit

log = logging.getLogger("app.policies")


class PolicyFileError(Exception):
    """A policy file is invalid; the message names the file, the rule and the field."""


def _loc(loc: tuple[int | str, ...], document: Any) -> str:
    """`rules[1] (milestones-thin).keep_last` from a pydantic error location."""
    out = ""
    node = document
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "policy"


def describe(error: ValidationError, document: Any) -> tuple[str, str]:
    """(first field, message naming every field at fault)."""
    items = error.errors()
    parts = [
        f"{_loc(tuple(item['loc']), document)}: {str(item['msg']).removeprefix('Value error, ')}"
        for item in items
    ]
    first = _loc(tuple(items[0]["loc"]), document) if items else "policy"
    return first, "; ".join(parts)


def validate_policy(document: Any, tiers: list[str]) -> Policy:
    """Validate a policy document against the configured tiers; raises Invalid naming the field."""
    if not isinstance(document, dict):
        raise Invalid("a policy must be a mapping with name and rules", field="policy")
    try:
        return Policy.model_validate(document, context={"tiers": tiers})
    except ValidationError as error:
        field, message = describe(error, document)
        raise Invalid(message, field=field) from None


def parse_yaml(text: str | bytes, *, field: str = "body") -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise Invalid(f"not valid YAML: {error}", field=field) from None
    except Exception as error:
        # PyYAML's constructors crash in many ways on odd input (a sign and underscores
        # read as a float, `!!bool maybe`, `!!timestamp x`, deep nesting): still the
        # client's bad input, never a 500.
        raise Invalid(f"not valid YAML: {type(error).__name__}", field=field) from None


def load_policy_files(directory: Path, tiers: list[str]) -> list[tuple[Path, Policy]]:
    """Every `*.yaml`/`*.yml` policy in `directory`, validated; the first bad file raises."""
    if not directory.is_dir():
        return []
    loaded: list[tuple[Path, Policy]] = []
    names: dict[str, Path] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        try:
            policy = validate_policy(parse_yaml(path.read_text()), tiers)
        except Invalid as error:
            raise PolicyFileError(f"policy file {path}: {error.message}") from None
        if policy.name in names:
            raise PolicyFileError(
                f"policy file {path}: name {policy.name!r} is also used by {names[policy.name]}"
            )
        names[policy.name] = path
        loaded.append((path, policy))
    return loaded


def to_document(policy: Policy) -> dict[str, Any]:
    return policy.model_dump(mode="json", by_alias=True, exclude_defaults=True)


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
        return row
    before = {"document": row.document}
    row.document, row.source, row.updated_at, row.updated_by = document, source, now, actor
    session.flush()
    if before["document"] != document:
        _audit(session, row.name, "updated", actor, now, before, {"document": document})
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
    _audit(session, name, "deleted", actor, now or datetime.now(UTC), before, None)
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
