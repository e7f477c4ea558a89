"""Shadow policies in an evaluation (DESIGN section 17): each evaluated run that a shadow
policy would govern is evaluated under it too, with the engine, the `now` and the
protections of the real plan, and its would-be actions go to the shadow ledger
(`shadow_actions`). Nothing else: no storage work, no action, no hold, no audit.

The shadow policy sees the catalog as if it had been carried out (app.policy.shadow): its
own earlier would-be actions, read from the shadow ledger in one statement for the runs
evaluated, are applied to the real checkpoints. Within one evaluation the policy is
evaluated again on what its new would-be actions leave, until it adds nothing, as an
enforced policy would be once its actions are done. So, as long as the policy in force
leaves alone what the shadow policy looks at, the shadow ledger is the ledger the policy
would have written had it been enforced."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Select, Table, select
from sqlalchemy.orm import Session

from app.cost.early_deletion import skip_costly_demotions
from app.cost.prices import PriceQuote
from app.db.bulk import bulk_insert
from app.db.models import Checkpoint, ShadowAction
from app.domain.duration import format_instant
from app.domain.ids import new_id
from app.domain.plan import PlannedAction, RunSnapshot
from app.domain.states import CheckpointState
from app.domain.tier import Tier
from app.policy.engine import evaluate
from app.policy.schema import Policy
from app.policy.shadow import Overlay, overlays, seen
from app.services.lifecycle.locks import Lock, hold_back_locked
from app.services.lifecycle.snapshot import Scope

# Each round only removes checkpoints, demotes them or adds copies: a handful of rounds
# reaches the point where the policy adds nothing more (the bound is a guard).
MAX_ROUNDS = 8

Key = tuple[str, str, str | None]  # checkpoint, kind, to_tier


@dataclass(frozen=True, slots=True)
class ShadowPlanned:
    """A would-be action of the shadow policy `policy`, found at the evaluation's `now`."""

    policy: str
    action: PlannedAction
    now: datetime


def plan_shadows(
    session: Session,
    *,
    scope: Scope,
    shadowed: Mapping[str, Sequence[Policy]],
    narrow: Callable[[Select], Select],  # type: ignore[type-arg]
    now: datetime,
    tiers: Sequence[Tier],
    prices: Mapping[str, PriceQuote],
    locks: Mapping[str, Lock],
) -> list[ShadowPlanned]:
    """The new would-be actions of the shadow policies of the runs in `shadowed` (run id ->
    the shadow policies that would govern it). `narrow` restricts a statement on checkpoints
    to the evaluation's scope, as the real plan's reads are. Reads the shadow ledger once."""
    names = sorted({p.name for policies in shadowed.values() for p in policies})
    if not names:
        return []
    done = _recorded(session, names, narrow)
    by_run = {run.id: run for run in scope.runs}
    found: list[ShadowPlanned] = []
    for run_id, policies in shadowed.items():
        run = by_run[run_id]
        for policy in policies:
            actions = evaluate_shadow(
                policy,
                run,
                scope,
                done.get((policy.name, run_id), {}),
                now,
                tiers=tiers,
                prices=prices,
                locks=locks,
            )
            found.extend(ShadowPlanned(policy.name, a, now) for a in actions)
    return found


def evaluate_shadow(
    policy: Policy,
    run: RunSnapshot,
    scope: Scope,
    recorded: Mapping[Key, datetime],
    now: datetime,
    *,
    tiers: Sequence[Tier],
    prices: Mapping[str, PriceQuote],
    locks: Mapping[str, Lock],
) -> list[PlannedAction]:
    """The new would-be actions of `policy` for `run` at `now`, in the order found, given
    those it recorded before for the run (`recorded`: (checkpoint, kind, to_tier) -> when).
    The real plan's steps (the engine, the demotions not worth their early-deletion charge
    left out, locked checkpoints neither deleted nor moved) on the run as the policy would
    have left it, again on what each round's actions leave until one adds nothing. Never
    returns a recorded key, nor an action for a checkpoint it deleted. Pure."""
    ranks = {t.name: t.rank for t in tiers}
    checkpoints = scope.checkpoints.get(run.id, [])
    if not checkpoints:
        return []
    mine = dict(recorded)
    overlay = overlays(mine, ranks)
    held = _with_placement_locks(locks, mine, tiers, now)
    new: list[PlannedAction] = []
    for _ in range(MAX_ROUNDS):
        view = seen(checkpoints, overlay)
        plan = evaluate(
            policy,
            run,
            view,
            now,
            tier_ranks=ranks,
            resumed_by_active=scope.resumed_by_active,
            explain=False,
            live_only=True,
        )
        plan = skip_costly_demotions(
            plan,
            policy,
            run,
            view,
            now,
            tier_ranks=ranks,
            prices=prices,
            resumed_by_active=scope.resumed_by_active,
        )
        actions, _locked = hold_back_locked(list(plan.actions), held)
        added = [a for a in actions if (a.checkpoint_id, a.kind, a.to_tier) not in mine]
        if not added:
            break
        for a in added:
            key = (a.checkpoint_id, a.kind, a.to_tier)
            mine[key] = now
            overlay.setdefault(a.checkpoint_id, Overlay()).add(a.kind, a.to_tier, ranks)
        held = _with_placement_locks(locks, mine, tiers, now)
        new.extend(added)
    return new


def _with_placement_locks(
    locks: Mapping[str, Lock], done: Mapping[Key, datetime], tiers: Sequence[Tier], now: datetime
) -> Mapping[str, Lock]:
    """The provider's locks, plus those the would-be placements would have set: a move or
    copy onto a tier with Object Lock writes the checkpoint locked for the tier's `retain`."""
    retained = {t.name: t for t in tiers if t.provider.object_lock is not None}
    if not retained:
        return locks
    merged = dict(locks)
    for (checkpoint_id, kind, to_tier), at in done.items():
        tier = retained.get(to_tier or "") if kind in ("move", "copy") else None
        if tier is None or tier.provider.object_lock is None:
            continue
        until = at + tier.provider.object_lock.retain
        if until > now and (checkpoint_id not in merged or merged[checkpoint_id][0] < until):
            why = f"written under Object Lock on {tier.name} until {format_instant(until)}"
            merged[checkpoint_id] = (until, why)
    return merged


def _recorded(
    session: Session,
    names: Collection[str],
    narrow: Callable[[Select], Select],  # type: ignore[type-arg]
) -> dict[tuple[str, str], dict[Key, datetime]]:
    """Per (shadow policy, run), the would-be actions recorded for the scope's active
    checkpoints (those of trashed or deleted ones can change no plan), with when."""
    stmt = narrow(
        select(
            ShadowAction.policy,
            ShadowAction.run_id,
            ShadowAction.checkpoint_id,
            ShadowAction.kind,
            ShadowAction.to_tier,
            ShadowAction.created_at,
        )
        .join(Checkpoint, Checkpoint.id == ShadowAction.checkpoint_id)
        .where(ShadowAction.policy.in_(sorted(names)), Checkpoint.state == CheckpointState.ACTIVE)
    )
    found: dict[tuple[str, str], dict[Key, datetime]] = {}
    for policy, run_id, checkpoint_id, kind, to_tier, at in session.execute(stmt):
        found.setdefault((policy, run_id), {})[(checkpoint_id, kind, to_tier)] = at
    return found


def record_shadows(
    session: Session, planned: Sequence[ShadowPlanned], *, trigger: str, sweep_id: str | None
) -> None:
    """Write the would-be actions to the shadow ledger, in one statement."""
    if not planned:
        return
    rows = [
        {
            "id": new_id("sha"),
            "policy": p.policy,
            "run_id": p.action.run_id,
            "checkpoint_id": p.action.checkpoint_id,
            "step": p.action.step,
            "kind": p.action.kind,
            "from_tier": p.action.from_tier,
            "to_tier": p.action.to_tier,
            "rule": p.action.rule,
            "reason": p.action.reason,
            "bytes": p.action.bytes,
            "created_at": p.now,
            "trigger": trigger,
            "sweep_id": sweep_id,
        }
        for p in planned
    ]
    bulk_insert(session, cast(Table, ShadowAction.__table__), rows)
