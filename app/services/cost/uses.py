"""When people came back for checkpoints: the uses a regret is judged against
(app.cost.regrets), read from the catalog. A restore is an action of kind `restore` (a
person's, or a job's `resume_point` staging its checkpoint back onto a hotter tier); a pin
is the audit trail's `pinned` event; a resume is a run started with `resumed_from`."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.cost.regrets import Use
from app.db.models import Action, AuditEvent, Run

CHUNK = 5000  # ids per IN list


def load_uses(
    session: Session, checkpoint_ids: Collection[str], *, since: datetime | None = None
) -> list[Use]:
    """Every use of the given checkpoints (after `since` when given), oldest first."""
    ids = sorted(set(checkpoint_ids))
    uses: list[Use] = []
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        restores = select(Action.checkpoint_id, Action.created_at).where(
            Action.kind == "restore", Action.checkpoint_id.in_(chunk)
        )
        pins = select(AuditEvent.checkpoint_id, AuditEvent.at).where(
            AuditEvent.entity == "checkpoint",
            AuditEvent.event == "pinned",
            AuditEvent.checkpoint_id.in_(chunk),
        )
        resumes = select(Run.resumed_from, Run.started_at).where(Run.resumed_from.in_(chunk))
        for query, kind in ((restores, "restored"), (pins, "pinned"), (resumes, "resumed_from")):
            for checkpoint_id, at in session.execute(query):
                if checkpoint_id is not None and (since is None or at >= since):
                    uses.append(Use(checkpoint_id, at, kind))  # type: ignore[arg-type]
    return sorted(uses, key=lambda u: (u.at, u.checkpoint_id))
