"""INSERT ... ON CONFLICT DO NOTHING for both supported databases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db.models import Base


def insert_ignoring_conflicts(session: Session, model: type[Base]) -> Any:
    table = model.__table__
    assert isinstance(table, Table)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"unsupported database {dialect!r}")


def upsert(session: Session, model: type[Base], *, index: str, values: dict[str, Any]) -> Any:
    """INSERT ... ON CONFLICT (index) DO UPDATE the other columns: one statement, so two
    processes writing the same row at once cannot both insert it."""
    module = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = module.insert(model.__table__).values(**values)
    changed = {k: stmt.excluded[k] for k in values if k != index}
    return stmt.on_conflict_do_update(index_elements=[index], set_=changed)
