"""What people ask of the lifecycle by hand: delete, undelete, restore. Each is a use case
in the request's transaction (it flushes; the request commits)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.cost.early_deletion import action_cost, describe_charges
from app.cost.prices import effective_price
from app.db.models import Action, Checkpoint
from app.domain.duration import format_instant
from app.domain.errors import Conflict, Invalid
from app.domain.states import ActionKind, ActionState, CheckpointState
from app.domain.tier import Tier
from app.services.catalog import audit
from app.services.catalog.lookup import get_checkpoint
from app.services.catalog.run_totals import add_active
from app.services.lifecycle.ledger import add_action, cancel_open, new_action, open_action, release


def request_delete(session: Session, checkpoint_id: str, actor: str, now: datetime) -> Action:
    """A person's delete: to the trash like a policy delete, never held. Refused while pinned."""
    checkpoint = get_checkpoint(session, checkpoint_id)
    if checkpoint.pinned:
        raise Conflict("checkpoint is pinned: unpin it before deleting", field="pinned")
    if checkpoint.state not in ("active", "writing"):
        raise Conflict(f"checkpoint is already {checkpoint.state}", field="state")
    existing = open_action(session, checkpoint_id, "delete", None)
    if existing is not None:
        if (
            existing.state == ActionState.HELD
        ):  # held by a policy's blast radius: asking approves it
            release(session, existing, actor, now)
            session.flush()
        return existing
    action = new_action(
        checkpoint_id=checkpoint_id,
        run_id=checkpoint.run_id,
        kind=ActionKind.DELETE,
        from_tier=_primary_tier(checkpoint),
        to_tier=None,
        rule="manual",
        reason="deleted by request",
        state=ActionState.PENDING,
        size=checkpoint.size_bytes,
        actor=actor,
        now=now,
    )
    add_action(session, action, now)
    session.flush()
    return action


def undelete(
    session: Session,
    checkpoint_id: str,
    actor: str,
    now: datetime,
    *,
    protect_for: timedelta,
    reservation_ttl: timedelta,
) -> Checkpoint:
    """Back from the trash to `active`, cancelling its pending purge (or, when the delete has
    not been executed yet, the delete itself). A person who undeletes means "keep this": no
    policy deletes or moves it for `protect_for` (the trash retention), then its policy
    governs it again.

    A checkpoint that was never committed (an aborted or abandoned reservation, or a
    reservation deleted by hand) comes back as what it was, `writing`, reserved for
    `reservation_ttl` from now: its save may commit it then. It gets no protection: until it
    commits no rule sees it, and once it does its policy governs it like any other save."""
    checkpoint = get_checkpoint(session, checkpoint_id)
    until = now + protect_for
    if checkpoint.state == CheckpointState.ACTIVE:
        before, after = {"protected_until": checkpoint.protected_until}, {"protected_until": until}
        _protect(session, checkpoint, actor, now, until, "protected", before, after)
        cancel_open(
            session,
            checkpoint_id,
            "delete",
            now,
            actor=actor,
            busy="it is being moved to the trash right now; try again",
            why="withdrawn by undelete",
        )
        return checkpoint
    if checkpoint.state != CheckpointState.TRASHED:
        raise Conflict(
            f"checkpoint is {checkpoint.state}; only a trashed one can come back", field="state"
        )
    cancel_open(
        session,
        checkpoint_id,
        "purge",
        now,
        actor=actor,
        busy="its bytes are being purged right now",
        why="withdrawn by undelete",
    )
    if checkpoint.committed_at is None:
        return reserve_again(session, checkpoint, actor, now, now + reservation_ttl)
    checkpoint.state = "active"
    checkpoint.trashed_at = None
    back: dict[str, Any] = {"state": "active", "protected_until": until}
    _protect(session, checkpoint, actor, now, until, "undeleted", {"state": "trashed"}, back)
    add_active(
        session,
        checkpoint.run_id,
        checkpoints=1,
        size=checkpoint.size_bytes,
        request_evaluation_at=now,
    )
    session.flush()
    return checkpoint


def reserve_again(
    session: Session,
    checkpoint: Checkpoint,
    actor: str,
    now: datetime,
    until: datetime,
    *,
    event: str = "undeleted",
    reason: str = "a reservation back from the trash",
) -> Checkpoint:
    """A checkpoint that was never committed (trashed, or purged) is `writing` again until
    `until`, audited as `event`: an undelete's, or a new save's of the same step."""
    was = checkpoint.state
    checkpoint.state = CheckpointState.WRITING
    checkpoint.trashed_at = None
    checkpoint.reserved_until = until
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
                before={"state": was, "reserved_until": None},
                after={"state": "writing", "reserved_until": until},
                reason=reason,
            )
        ],
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
    if checkpoint.state != CheckpointState.ACTIVE:
        raise Conflict(f"checkpoint is {checkpoint.state}; undelete it first", field="state")
    existing = open_action(session, checkpoint_id, "restore", tier)
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
        kind=ActionKind.RESTORE,
        from_tier=source,
        to_tier=tier,
        rule="manual",
        reason=reason,
        state=ActionState.PENDING,
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
