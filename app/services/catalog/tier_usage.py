"""Tier usage: what each tier holds right now."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Location
from app.domain.states import STORED_STATES
from app.services.catalog.runs import runs_in


def tier_usage(
    session: Session, *, projects: Collection[str] | None = None
) -> dict[str, tuple[int, int]]:
    """tier name -> (bytes, checkpoints) over every location of a live or trashed checkpoint,
    of the projects in `projects` when given."""
    stmt = (
        select(Location.tier, func.coalesce(func.sum(Checkpoint.size_bytes), 0), func.count())
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(Checkpoint.state.in_(STORED_STATES))  # trashed bytes are still billed
        .group_by(Location.tier)
    )
    if projects is not None:
        stmt = stmt.where(Checkpoint.run_id.in_(runs_in(projects)))
    rows = session.execute(stmt).all()
    return {tier: (int(size), int(count)) for tier, size, count in rows}
