"""What a removal leaves on the bill: a tier whose provider keeps deleted bytes (GCS soft
delete, noncurrent versions the bucket's lifecycle expires) bills them after the service
removed them, and the cost reports and forecasts must say so."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, DeletedBytes, Project, Run
from app.domain.tier import Tier


def record_removed(
    session: Session, action_id: str, checkpoint: Checkpoint, tier: Tier | None, now: datetime
) -> None:
    """Keep the bytes of `checkpoint` just removed from `tier` on the bill for as long as
    its provider keeps them; nothing for a bucket that forgets at once. Once per action and
    tier, so a resumed action that removes again does not count twice."""
    if tier is None:
        return
    kept = tier.provider.billed_after_delete
    if kept is not None and not kept:
        return
    recorded = session.execute(
        select(DeletedBytes.id).where(
            DeletedBytes.action_id == action_id, DeletedBytes.tier == tier.name
        )
    ).first()
    if recorded is not None:
        return
    project = session.execute(
        select(Project.name)
        .join(Run, Run.project_id == Project.id)
        .where(Run.id == checkpoint.run_id)
    ).scalar_one()
    session.add(
        DeletedBytes(
            action_id=action_id,
            checkpoint_id=checkpoint.id,
            project=project,
            run_id=checkpoint.run_id,
            klass=checkpoint.klass,
            tier=tier.name,
            bytes=checkpoint.size_bytes,
            deleted_at=now,
            billed_until=None if kept is None else now + kept,
        )
    )
