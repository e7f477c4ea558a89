"""Reading one checkpoint by id, for the use cases that change it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.db.models import Checkpoint
from app.domain.errors import NotFound


def get_checkpoint(session: Session, checkpoint_id: str, *, for_update: bool = False) -> Checkpoint:
    """The checkpoint with its locations, or NotFound. `for_update` locks its row until the
    transaction ends (PostgreSQL; SQLite has one writer at a time): a change of state that
    reads the state first (commit, keepalive, abort) never acts on a stale one."""
    stmt = (
        select(Checkpoint)
        .where(Checkpoint.id == checkpoint_id)
        .options(selectinload(Checkpoint.locations))
    )
    if for_update:
        stmt = stmt.with_for_update(of=Checkpoint)
    checkpoint = (
        None
        if "\x00" in checkpoint_id  # no id holds one, and PostgreSQL refuses it as a parameter
        else session.execute(stmt).scalar_one_or_none()
    )
    if checkpoint is None:
        raise NotFound(f"no checkpoint has id {checkpoint_id!r}", field="checkpoint_id")
    return checkpoint
