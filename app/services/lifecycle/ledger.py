"""The action ledger: what sweeps and people ask of storage, one row per action.

Every change to storage is an Action row first; workers execute them (executor.py).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from app import metrics
from app.cost.early_deletion import action_cost, describe_charges
from app.cost.prices import effective_price
from app.db.models import Action, Checkpoint, Project, Run, Sweep
from app.db.pagination import decode_cursor, encode_cursor
from app.domain.access import SCHEDULER_ACTOR, rule_actor
from app.domain.duration import format_instant
from app.domain.errors import Conflict, Invalid, NotFound
from app.domain.ids import new_id
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.catalog import audit
from app.services.catalog.checkpoints import get_checkpoint
from app.services.catalog.run_totals import count_active
from app.services.lifecycle.planning import OPEN_STATES, plan_catalog, replan_after

SWEEP_LOCK_KEY = 0x636B7074  # "ckpt": one evaluation writes to the ledger at a time
_local_sweep_lock = threading.Lock()


@contextmanager
def evaluation_lock(session: Session) -> Iterator[None]:
    """Serialise evaluations that write actions: a PostgreSQL advisory lock held until the
    transaction ends (so several replicas never sweep at once), a process lock on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SWEEP_LOCK_KEY})
        yield
        return
    with _local_sweep_lock:
        yield


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
    """
    session = factory()
    try:
        with evaluation_lock(session):
            plan = plan_catalog(
                session,
                tiers=tiers,
                now=now,
                project=project,
                run_id=run_id,
                policy=policy,
                explain=False,
            )
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
            created: list[str] = []
            events: list[dict[str, Any]] = []
            for item in plan.items:
                if item.open_action_id is not None:
                    continue
                a = item.action
                action = new_action(
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
                session.add(action)
                created.append(action.id)
                events.append(audit.action_created(action, at=now))
                sweep.held += item.state == "held"
            audit.record_many(session, events)
            sweep.actions = len(created)
            sweep.finished_at = now
            if not created and trigger == "registration":
                session.expunge(sweep)
            if answers_request is not None and run_id is not None:
                session.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.evaluate_requested_at <= answers_request)
                    .values(evaluate_requested_at=None)
                    .execution_options(synchronize_session=False)
                )
            session.commit()
            return sweep.id, created
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


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


def new_action(
    *,
    checkpoint_id: str,
    run_id: str,
    kind: str,
    from_tier: str | None,
    to_tier: str | None,
    rule: str,
    reason: str | None,
    state: str,
    size: int,
    actor: str | None,
    now: datetime,
    due_at: datetime | None = None,
    sweep_id: str | None = None,
) -> Action:
    return Action(
        id=new_id("act"),
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        kind=kind,
        from_tier=from_tier,
        to_tier=to_tier,
        rule=rule,
        reason=reason,
        state=state,
        attempts=0,
        bytes=size,
        sweep_id=sweep_id,
        due_at=due_at or now,
        created_at=now,
        updated_at=now,
        actor=actor,
    )


def add_action(session: Session, action: Action, now: datetime) -> Action:
    """Put a new action in the ledger, and its creation in the audit trail."""
    session.add(action)
    audit.record_many(session, [audit.action_created(action, at=now)])
    return action


def get_action(session: Session, action_id: str) -> Action:
    action = session.get(Action, action_id)
    if action is None:
        raise NotFound(f"no action has id {action_id!r}", field="action_id")
    return action


def list_actions(
    session: Session,
    *,
    state: str | None,
    kind: str | None,
    checkpoint_id: str | None,
    run_id: str | None,
    limit: int,
    cursor: str | None,
    projects: Collection[str] | None = None,
) -> tuple[list[Action], str | None]:
    """Newest first; only actions on runs of `projects` when given (a bounded caller's)."""
    stmt = select(Action).order_by(Action.id.desc()).limit(limit + 1)
    if projects is not None:
        stmt = stmt.where(
            Action.run_id.in_(
                select(Run.id).join(Project).where(Project.name.in_(sorted(projects)))
            )
        )
    for column, value in (
        (Action.state, state),
        (Action.kind, kind),
        (Action.checkpoint_id, checkpoint_id),
        (Action.run_id, run_id),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if cursor is not None:
        (last,) = decode_cursor(cursor, str)
        stmt = stmt.where(Action.id < last)
    rows = list(session.execute(stmt).scalars())
    page = rows[:limit]
    return page, encode_cursor(page[-1].id) if len(rows) > limit else None


def approve_action(session: Session, action_id: str, actor: str, now: datetime) -> Action:
    """Release a held delete. Approving one that is no longer held is a no-op."""
    action = get_action(session, action_id)
    if action.state == "held":
        _release(session, action, actor, now)
        session.flush()
    return action


def _approved(action: Action, actor: str, now: datetime) -> dict[str, Any]:
    return audit.action_event(
        action,
        "approved",
        at=now,
        actor=actor,
        before={"state": "held"},
        after={"state": "pending", "approved_by": actor},
    )


def _release(session: Session, action: Action, actor: str, now: datetime) -> None:
    action.state = "pending"
    action.due_at = now
    action.updated_at = now
    action.approved_by = actor
    audit.record_many(session, [_approved(action, actor, now)])


def approve_sweep(session: Session, sweep_id: str, actor: str, now: datetime) -> list[str]:
    if session.get(Sweep, sweep_id) is None:
        raise NotFound(f"no sweep has id {sweep_id!r}", field="sweep_id")
    held = list(
        session.execute(
            select(Action)
            .where(Action.sweep_id == sweep_id, Action.state == "held")
            .with_for_update()  # what is approved is exactly what is audited
        ).scalars()
    )
    ids = [a.id for a in held]
    session.execute(
        update(Action)
        .where(Action.id.in_(ids), Action.state == "held")
        .values(state="pending", due_at=now, updated_at=now, approved_by=actor)
    )
    audit.record_many(session, [_approved(a, actor, now) for a in held])
    return ids


def _open_action(
    session: Session, checkpoint_id: str, kind: str, to_tier: str | None
) -> Action | None:
    return (
        session.execute(
            select(Action).where(
                Action.checkpoint_id == checkpoint_id,
                Action.kind == kind,
                Action.to_tier == to_tier if to_tier is not None else Action.to_tier.is_(None),
                Action.state.in_(OPEN_STATES),
            )
        )
        .scalars()
        .first()
    )


def request_delete(session: Session, checkpoint_id: str, actor: str, now: datetime) -> Action:
    """A person's delete: to the trash like a policy delete, never held. Refused while pinned."""
    checkpoint = get_checkpoint(session, checkpoint_id)
    if checkpoint.pinned:
        raise Conflict("checkpoint is pinned: unpin it before deleting", field="pinned")
    if checkpoint.state not in ("active", "writing"):
        raise Conflict(f"checkpoint is already {checkpoint.state}", field="state")
    existing = _open_action(session, checkpoint_id, "delete", None)
    if existing is not None:
        if existing.state == "held":  # held by a policy's blast radius: asking approves it
            _release(session, existing, actor, now)
            session.flush()
        return existing
    action = new_action(
        checkpoint_id=checkpoint_id,
        run_id=checkpoint.run_id,
        kind="delete",
        from_tier=_primary_tier(checkpoint),
        to_tier=None,
        rule="manual",
        reason="deleted by request",
        state="pending",
        size=checkpoint.size_bytes,
        actor=actor,
        now=now,
    )
    add_action(session, action, now)
    session.flush()
    return action


def _cancel_open(
    session: Session,
    checkpoint_id: str,
    kind: str,
    now: datetime,
    *,
    actor: str,
    busy: str,
    why: str,
) -> None:
    """Cancel the checkpoint's open actions of `kind`; Conflict (`busy`) if one is running."""
    actions = list(
        session.execute(
            select(Action).where(
                Action.checkpoint_id == checkpoint_id,
                Action.kind == kind,
                Action.state.in_(OPEN_STATES),
            )
        ).scalars()
    )
    if any(a.state == "running" for a in actions):
        raise Conflict(busy, field="state")
    events = []
    for action in actions:
        events.append(
            audit.action_event(
                action,
                "cancelled",
                at=now,
                actor=actor,
                before={"state": action.state},
                after={"state": "cancelled", "error": why},
            )
        )
        action.state = "cancelled"
        action.error = why
        action.updated_at = now
        action.finished_at = now
    audit.record_many(session, events)
    session.flush()


def undelete(
    session: Session,
    checkpoint_id: str,
    actor: str,
    now: datetime,
    *,
    protect_for: timedelta,
) -> Checkpoint:
    """Back from the trash to `active`, cancelling its pending purge (or, when the delete has
    not been executed yet, the delete itself). A person who undeletes means "keep this": no
    policy deletes or moves it for `protect_for` (the trash retention), then its policy
    governs it again."""
    checkpoint = get_checkpoint(session, checkpoint_id)
    until = now + protect_for
    if checkpoint.state == "active":
        before, after = {"protected_until": checkpoint.protected_until}, {"protected_until": until}
        _protect(session, checkpoint, actor, now, until, "protected", before, after)
        _cancel_open(
            session,
            checkpoint_id,
            "delete",
            now,
            actor=actor,
            busy="it is being moved to the trash right now; try again",
            why="withdrawn by undelete",
        )
        return checkpoint
    if checkpoint.state != "trashed":
        raise Conflict(
            f"checkpoint is {checkpoint.state}; only a trashed one can come back", field="state"
        )
    _cancel_open(
        session,
        checkpoint_id,
        "purge",
        now,
        actor=actor,
        busy="its bytes are being purged right now",
        why="withdrawn by undelete",
    )
    checkpoint.state = "active"
    checkpoint.trashed_at = None
    back: dict[str, Any] = {"state": "active", "protected_until": until}
    _protect(session, checkpoint, actor, now, until, "undeleted", {"state": "trashed"}, back)
    count_active(
        session, checkpoint.run_id, checkpoints=1, size=checkpoint.size_bytes, evaluate_at=now
    )
    session.flush()
    return checkpoint


def _protect(
    session: Session,
    checkpoint: Checkpoint,
    actor: str,
    now: datetime,
    until: datetime,
    event: str,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    """Protect an undeleted checkpoint until `until` and audit it as `event` (`undeleted`
    from the trash, `protected` when its delete had not run yet)."""
    checkpoint.protected_until = until
    checkpoint.updated_by = actor
    audit.record_many(
        session,
        [
            audit.checkpoint_event(
                checkpoint.id,
                checkpoint.run_id,
                event,
                actor=actor,
                at=now,
                before=before,
                after=after,
                reason=f"protected: undeleted until {format_instant(until)}",
            )
        ],
    )


def request_restore(
    session: Session,
    *,
    checkpoint_id: str,
    tier: str,
    at: datetime | None,
    tiers: list[Tier],
    actor: str,
    now: datetime,
) -> Action:
    """Stage a copy of the checkpoint onto `tier`, now or at `at`."""
    if tier not in {t.name for t in tiers}:
        raise Invalid(f"unknown tier {tier!r}", field="tier")
    checkpoint = get_checkpoint(session, checkpoint_id)
    if checkpoint.state != "active":
        raise Conflict(f"checkpoint is {checkpoint.state}; undelete it first", field="state")
    existing = _open_action(session, checkpoint_id, "restore", tier)
    if existing is not None:
        return existing
    here = next((loc for loc in checkpoint.locations if loc.tier == tier), None)
    if here is not None:  # a copy onto itself would do nothing: say so, queue nothing
        raise Conflict(
            f"the checkpoint already has its {here.role} location on {tier}", field="tier"
        )
    source = _primary_tier(checkpoint)
    reason = f"restore to {tier} requested"
    charges = _restore_charges(checkpoint, source, tier, tiers)
    if charges is not None:
        reason += f"; one-off charges {charges}"
    action = new_action(
        checkpoint_id=checkpoint_id,
        run_id=checkpoint.run_id,
        kind="restore",
        from_tier=source,
        to_tier=tier,
        rule="manual",
        reason=reason,
        state="pending",
        size=checkpoint.size_bytes,
        actor=actor,
        now=now,
        due_at=at if at is not None and at > now else now,
    )
    add_action(session, action, now)
    session.flush()
    return action


def _restore_charges(
    checkpoint: Checkpoint, source: str | None, target: str, tiers: list[Tier]
) -> str | None:
    """What reading the checkpoint off its tier will cost (retrieval, egress when it leaves
    the provider's network, requests), said in the action's reason before anyone pays it."""
    by_name = {t.name: t for t in tiers}
    if source is None or source not in by_name:
        return None
    cost = action_cost(
        "restore",
        checkpoint.size_bytes,
        source=effective_price(by_name[source]),
        target=effective_price(by_name[target]),
        objects=max(1, len(checkpoint.files or [])),
    )
    return describe_charges(cost)


def _primary_tier(checkpoint: Checkpoint) -> str | None:
    return next((loc.tier for loc in checkpoint.locations if loc.role == "primary"), None)


def enqueue_due_purges(
    session: Session, *, retention: timedelta, now: datetime, limit: int = 1000
) -> int:
    """Create a purge for every trashed checkpoint whose trash period is over. A purge that
    failed (refused because another checkpoint owns bytes there, say) is tried again only
    after a pause that doubles with each failure, not every 30 s."""
    cutoff = now - retention
    rows = session.execute(
        select(Checkpoint.id, Checkpoint.run_id, Checkpoint.size_bytes)
        .where(Checkpoint.state == "trashed", Checkpoint.trashed_at <= cutoff)
        .limit(limit)
    ).all()
    failed = _failed_purges(session, [row[0] for row in rows])
    created = 0
    for checkpoint_id, run_id, size in rows:
        if _open_action(session, checkpoint_id, "purge", None) is not None:
            continue
        failures = failed.get(checkpoint_id)
        if failures is not None and failures[1] + replan_after(failures[0]) > now:
            continue
        add_action(session, purge_action(session, checkpoint_id, run_id, size, now), now)
        created += 1
    session.flush()
    return created


def _failed_purges(session: Session, checkpoint_ids: list[str]) -> dict[str, tuple[int, datetime]]:
    """Per checkpoint: how many purges failed, and when the last one did."""
    if not checkpoint_ids:
        return {}
    rows = session.execute(
        select(Action.checkpoint_id, func.count(), func.max(Action.finished_at))
        .where(
            Action.checkpoint_id.in_(checkpoint_ids),
            Action.kind == "purge",
            Action.state == "failed",
        )
        .group_by(Action.checkpoint_id)
    )
    return {cid: (int(count), last) for cid, count, last in rows if last is not None}


def purge_action(
    session: Session, checkpoint_id: str, run_id: str, size: int, now: datetime
) -> Action:
    """A purge carries the rule and the actor of the delete that trashed the checkpoint:
    whoever decided the delete decided the purge."""
    delete = session.execute(
        select(Action.rule, Action.actor)
        .where(
            Action.checkpoint_id == checkpoint_id, Action.kind == "delete", Action.state == "done"
        )
        .order_by(Action.finished_at.desc())
        .limit(1)
    ).one_or_none()
    rule, actor = delete if delete is not None else (None, None)
    return new_action(
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        kind="purge",
        from_tier=None,
        to_tier=None,
        rule=rule or "manual",
        reason="trash period over",
        state="pending",
        size=size,
        actor=actor,  # None only after a delete recorded before actors were
        now=now,
    )
