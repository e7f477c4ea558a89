"""PATCH of a checkpoint: re-class it (promote the last save to `final`, a good one to
`milestone`), merge labels and metrics. Audited with what changed, and the run is evaluated
again, as after a registration."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.db.models import Checkpoint
from app.domain.errors import Conflict, Invalid
from app.domain.states import CheckpointState
from app.services.catalog import audit
from app.services.catalog.lookup import get_checkpoint
from app.services.catalog.run_totals import add_active

MAX_LABELS = 64
MAX_METRICS = 256
V = TypeVar("V")


def merged(current: Mapping[str, V], patch: Mapping[str, V | None]) -> dict[str, V]:
    """`current` with `patch` laid over it; a key patched to None is removed (a missing key
    removed is no error: the same PATCH twice gives the same checkpoint)."""
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def update_checkpoint(
    session: Session,
    *,
    checkpoint_id: str,
    changes: Mapping[str, Any],
    actor: str,
    now: datetime,
) -> Checkpoint:
    """Apply a PATCH (`class`, `labels`, `metrics`, each optional; the keys left out stay).

    Raises NotFound for an unknown id, Invalid (naming the field) for a null `class`,
    `labels` or `metrics`, or a merge beyond 64 labels or 256 metrics, and Conflict for a
    `deleted` checkpoint: its bytes are gone and its record is history. A change records
    one `updated` audit event (before and after of what changed) and, when the checkpoint
    is `active` (rules see no other), asks for its run's evaluation. Idempotent: a PATCH
    that changes nothing records nothing.
    """
    for field in ("class", "labels", "metrics"):
        if field in changes and changes[field] is None:
            raise Invalid(f"{field} cannot be null: leave it out to keep it", field=field)
    checkpoint = get_checkpoint(session, checkpoint_id, for_update=True)
    if checkpoint.state == CheckpointState.DELETED:
        raise Conflict(
            "checkpoint is deleted: its bytes are gone and its record is kept as it was",
            field="state",
        )
    was = {"class": checkpoint.klass, "labels": checkpoint.labels, "metrics": checkpoint.metrics}
    labels = merged(checkpoint.labels or {}, changes.get("labels", {}))
    metrics = merged(checkpoint.metrics or {}, changes.get("metrics", {}))
    if len(labels) > MAX_LABELS:
        raise Invalid(
            f"a checkpoint holds at most {MAX_LABELS} labels; this would make {len(labels)}",
            field="labels",
        )
    if len(metrics) > MAX_METRICS:
        raise Invalid(
            f"a checkpoint holds at most {MAX_METRICS} metrics; this would make {len(metrics)}",
            field="metrics",
        )
    now_is = {"class": changes.get("class", checkpoint.klass), "labels": labels, "metrics": metrics}
    before, after = audit.diff(was, now_is)
    if not after:
        return checkpoint
    checkpoint.klass = now_is["class"]
    checkpoint.labels = labels  # new objects: the JSON columns see the change
    checkpoint.metrics = metrics
    checkpoint.updated_by = actor
    audit.record_many(
        session,
        [
            audit.checkpoint_event(
                checkpoint.id,
                checkpoint.run_id,
                "updated",
                actor=actor,
                at=now,
                before=before,
                after=after,
            )
        ],
    )
    if checkpoint.state == CheckpointState.ACTIVE:
        add_active(session, checkpoint.run_id, checkpoints=0, size=0, request_evaluation_at=now)
    session.flush()
    return checkpoint
