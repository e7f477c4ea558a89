"""Sweeps: one evaluation of the policies over the catalog, written to the ledger in one
transaction (a job: it takes a session factory and commits itself)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app import metrics
from app.db.dialect import transaction_lock
from app.db.models import NewAction, Run, Sweep
from app.domain.access import SCHEDULER_ACTOR, rule_actor
from app.domain.ids import new_id
from app.domain.states import ActionState
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.catalog import audit
from app.services.catalog.due_runs import due_run_ids, record_next_due
from app.services.lifecycle.ledger import insert_actions, planned_action
from app.services.lifecycle.planning import CatalogPlan, plan_catalog
from app.services.lifecycle.shadow import record_shadows

SWEEP_LOCK_KEY = 0x636B7074  # "ckpt": one evaluation writes to the ledger at a time


def evaluation_lock(session: Session) -> AbstractContextManager[None]:
    """Serialise evaluations that write actions: several replicas never sweep at once.
    Its commit waits for the disk like any other: a planned action, once anyone may have
    seen it (a held delete an admin is about to approve), is never lost."""
    return transaction_lock(session, SWEEP_LOCK_KEY)


@metrics.timed_sweep
def run_sweep(
    factory: sessionmaker[Session],
    *,
    tiers: list[Tier],
    now: datetime,
    trigger: str,
    actor: str = SCHEDULER_ACTOR,
    project: str | None = None,
    run_id: str | None = None,
    policy: Policy | None = None,
    answers_request: datetime | None = None,
    due_only: bool = False,
) -> tuple[str, list[str]]:
    """Evaluate and write every planned action to the ledger; returns (sweep id, action ids).
    The sweep records `actor` (who started it: the scheduler unless a person or a token did);
    each action records the rule that planned it.
    With `answers_request` (one run's `evaluate_requested_at`), that request is cleared in
    the same transaction, unless a newer one arrived meanwhile.

    Idempotent: a checkpoint with an open action of the same kind and target gets no second
    one. Planned deletes beyond the blast radius are created `held`. Commits before returning.
    A registration-triggered evaluation that adds nothing leaves no sweep row behind.
    Every new action is audited (one statement for all of them), as its rule.

    With `due_only` (the periodic sweep) only the runs whose plan may have changed are
    evaluated (catalog.due_runs); every evaluation under the governing policies writes when
    each run it evaluated is due again.

    Each evaluated run that a shadow policy would govern is evaluated under it too, and its
    would-be actions go to the shadow ledger (app.services.lifecycle.shadow), nothing else.
    """
    session = factory()
    try:
        with evaluation_lock(session):
            run_ids = _due(session, now) if due_only else None
            plan = (
                plan_catalog(
                    session,
                    tiers=tiers,
                    now=now,
                    project=project,
                    run_id=run_id,
                    policy=policy,
                    explain=False,
                    run_ids=run_ids,
                    due=policy is None,
                    shadows=policy is None,
                )
                if run_ids != []
                else CatalogPlan()
            )
            record_next_due(session, plan.next_due)
            sweep = Sweep(
                id=new_id("swp"),
                trigger=trigger,
                run_id=run_id,
                started_at=now,
                actions=0,
                held=0,
                actor=actor,
            )
            session.add(sweep)
            created: list[NewAction] = []
            events: list[dict[str, Any]] = []
            for item in plan.items:
                if item.open_action_id is not None:
                    continue
                a = item.action
                action = planned_action(
                    checkpoint_id=a.checkpoint_id,
                    run_id=a.run_id,
                    kind=a.kind,
                    from_tier=a.from_tier,
                    to_tier=a.to_tier,
                    rule=a.rule,
                    reason=a.reason,
                    state=item.state,
                    size=a.bytes,
                    actor=rule_actor(a.rule),
                    now=now,
                    sweep_id=sweep.id,
                )
                created.append(action)
                events.append(audit.action_created(action, at=now))
                sweep.held += item.state == ActionState.HELD
            insert_actions(session, created)
            audit.record_many(session, events)
            sweep.actions = len(created)
            sweep.finished_at = now
            kept = bool(created) or trigger != "registration"
            if not kept:
                session.expunge(sweep)
            record_shadows(
                session, plan.shadow, trigger=trigger, sweep_id=sweep.id if kept else None
            )
            if answers_request is not None and run_id is not None:
                session.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.evaluate_requested_at <= answers_request)
                    .values(evaluate_requested_at=None)
                    .execution_options(synchronize_session=False)
                )
            session.commit()
            return sweep.id, [a.id for a in created]
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# Beyond this many due runs (after a policy edit, say) a sweep plans the whole catalog
# rather than name every run in one statement.
WHOLE_CATALOG_ABOVE = 2000


def _due(session: Session, now: datetime) -> list[str] | None:
    """The due runs, or None to plan every run."""
    due = due_run_ids(session, now)
    return None if len(due) > WHOLE_CATALOG_ABOVE else due


def requested_evaluations(
    session: Session, *, before: datetime, limit: int = 200
) -> list[tuple[str, datetime]]:
    """Runs whose evaluation was asked for before `before`, oldest request first."""
    rows = session.execute(
        select(Run.id, Run.evaluate_requested_at)
        .where(Run.evaluate_requested_at.is_not(None), Run.evaluate_requested_at <= before)
        .order_by(Run.evaluate_requested_at)
        .limit(limit)
    ).all()
    return [(run_id, at) for run_id, at in rows if at is not None]
