"""A reconciliation's findings written to the catalog: each checkpoint's `health`, audited
when it changes, so `GET /v1/checkpoints` shows what the last scan found."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app import metrics
from app.db.models import Checkpoint
from app.db.session import session_scope
from app.services.catalog import audit
from app.services.lifecycle.reconcile_report import Report

log = logging.getLogger("app.reconcile")


log = logging.getLogger("app.reconcile")


def record_health(
    factory: sessionmaker[Session], report: Report, *, actor: str, now: datetime
) -> None:
    """Mark drifted checkpoints, clear those a scan found whole, audit both, and tell the
    admins."""
    problems: dict[str, str] = {}
    for d in report.drift:
        with_whom = (
            f" with {d.other_checkpoint_id} ({d.other_uri})" if d.other_checkpoint_id else ""
        )
        problems.setdefault(d.checkpoint_id, f"{d.problem}{with_whom} at {d.uri}")
    skipped = set(report.unreachable)
    with session_scope(factory) as session:
        was_drifting = set(
            session.execute(select(Checkpoint.id).where(Checkpoint.health == "drift")).scalars()
        )
        for checkpoint_id, problem in problems.items():
            session.execute(
                update(Checkpoint)
                .where(Checkpoint.id == checkpoint_id)
                .values(health="drift", health_detail=problem)
            )
        healed = was_drifting - set(problems) if not skipped else set()
        # (an unreachable tier proves nothing either way: nobody is cleared then)
        if healed:
            session.execute(
                update(Checkpoint)
                .where(Checkpoint.id.in_(healed))
                .values(health="ok", health_detail=None)
            )
        changed = (set(problems) - was_drifting) | healed
        runs: dict[str, str] = {
            checkpoint_id: run_id
            for checkpoint_id, run_id in session.execute(
                select(Checkpoint.id, Checkpoint.run_id).where(Checkpoint.id.in_(changed))
            )
        }
        audit.record_many(
            session,
            [
                audit.checkpoint_event(
                    checkpoint_id,
                    runs[checkpoint_id],
                    "healed" if checkpoint_id in healed else "drifted",
                    actor=actor,
                    at=now,
                    before={"health": "drift" if checkpoint_id in healed else "ok"},
                    after=(
                        {"health": "ok"}
                        if checkpoint_id in healed
                        else {"health": "drift", "health_detail": problems[checkpoint_id]}
                    ),
                    reason="reconciliation",
                )
                for checkpoint_id in sorted(changed)
            ],
        )
    for checkpoint_id, problem in problems.items():
        if checkpoint_id not in was_drifting:
            log.warning(
                "checkpoint drifted from the catalog",
                extra={"checkpoint_id": checkpoint_id, "problem": problem},
            )
    metrics.reconciled(len(report.orphans), len(problems), report.scanned_objects)
