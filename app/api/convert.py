"""ORM rows to response bodies."""

from __future__ import annotations

from app.api.schemas import CheckpointRead, LocationRead, RunRead
from app.db.models import Checkpoint
from app.services.catalog.runs import RunView


def run_read(view: RunView) -> RunRead:
    run = view.run
    return RunRead(
        id=run.id,
        project=view.project,
        name=run.name,
        status=run.status,
        labels=run.labels,
        policy=run.policy,
        resumed_from=run.resumed_from,
        started_at=run.started_at,
        ended_at=run.ended_at,
        created_by=run.created_by,
        updated_by=run.updated_by,
    )


def checkpoint_read(checkpoint: Checkpoint) -> CheckpointRead:
    locations = [
        LocationRead(
            tier=loc.tier,
            uri=loc.uri,
            storage_class=loc.storage_class,
            role=loc.role,
        )
        for loc in checkpoint.locations
    ]
    primary = next((loc.tier for loc in locations if loc.role == "primary"), None)
    return CheckpointRead(
        id=checkpoint.id,
        run_id=checkpoint.run_id,
        step=checkpoint.step,
        class_=checkpoint.klass,
        state=checkpoint.state,
        uri=checkpoint.uri,
        size_bytes=checkpoint.size_bytes,
        files=checkpoint.files,
        metrics=checkpoint.metrics,
        labels=checkpoint.labels,
        pinned=checkpoint.pinned,
        pin_reason=checkpoint.pin_reason,
        created_at=checkpoint.created_at,
        tier=primary,
        locations=locations,
        created_by=checkpoint.created_by,
        updated_by=checkpoint.updated_by,
        health=checkpoint.health or "ok",
        health_detail=checkpoint.health_detail,
        protected_until=checkpoint.protected_until,
        locked_until=checkpoint.locked_until,
        lock_reason=checkpoint.lock_reason,
        reserved_until=checkpoint.reserved_until,
    )
