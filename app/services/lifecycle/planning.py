"""Dry-run plans over the catalog: the engine per run, less the demotions not worth their
early-deletion penalty, plus the blast-radius hold."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple, TypedDict

from sqlalchemy.orm import Session

from app.cost.early_deletion import ActionCost
from app.cost.prices import effective_price
from app.domain.errors import Invalid
from app.domain.plan import Kept, PlannedAction, Skipped
from app.domain.states import ActionKind
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.catalog.policies import active_policies
from app.services.catalog.run_totals import project_totals
from app.services.lifecycle.locks import current_locks
from app.services.lifecycle.plan_helpers import evaluate_in_parts, plan_ranges
from app.services.lifecycle.plan_ledger import read_ledger
from app.services.lifecycle.plan_parts import (
    Loaded,
    PlanInputs,
    deleting_projects,
    evaluate_scope,
    loaded_by_project,
)
from app.services.lifecycle.shadow import ShadowPlanned, plan_shadows
from app.services.lifecycle.snapshot import Scope, gc_paused, load_scope, ranked_by, restrict


class PlanItem(NamedTuple):
    """One planned action as a plan reports it (a tuple: a replan makes 200,000)."""

    action: PlannedAction
    state: str  # held | pending, or the state of the open action already in the ledger
    open_action_id: str | None = None
    # One-off charges at the tiers' prices (retrieval, egress, early deletion, requests)
    # and the USD a month each tier's storage bill changes by once done; computed for
    # explained plans (dry runs), None in a sweep.
    cost: ActionCost | None = None
    storage: tuple[tuple[str, float], ...] | None = None

    @property
    def usd_month(self) -> float:
        """The monthly storage change the action makes, negative for a saving."""
        return sum(amount for _, amount in self.storage or ()) + 0.0

    @property
    def one_off_usd(self) -> float:
        return self.cost.total_usd if self.cost is not None else 0.0


class Totals(TypedDict):
    """Byte totals keyed as section 6 names them: `deleted_bytes_by_tier` and
    `moved_bytes_by_tier` by the tier the bytes leave, `copied_bytes_by_tier` by the tier
    they are copied to; `usd_month_by_tier` by every tier whose bill changes (a move
    lowers its source's and raises its target's)."""

    deleted_bytes_by_tier: dict[str, int]
    moved_bytes_by_tier: dict[str, int]
    copied_bytes_by_tier: dict[str, int]
    usd_month_by_tier: dict[str, float]
    one_off_usd: float


@dataclass
class CatalogPlan:
    items: list[PlanItem] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    # more kept checkpoints, after `kept`, already encoded (with `kept_as_json`): pieces of
    # app.services.lifecycle.plan_parts.kept_pieces
    kept_json: list[bytes] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # (run id, next_due_at as read, next change by the clock) of each run, when asked
    next_due: list[tuple[str, datetime | None, datetime | None]] = field(default_factory=list)
    # the shadow policies' new would-be actions, when asked (a sweep's)
    shadow: list[ShadowPlanned] = field(default_factory=list)
    # what the plan read, when asked to keep it: a caller that answers before it lets go
    # of the plan frees both after (a million snapshots take most of a second to free)
    read: Scope | None = None

    def fees_usd(self) -> float:
        """The one-off charges of every planned action whose cost was computed."""
        return sum((i.cost.total_usd for i in self.items if i.cost is not None), 0.0)

    def totals(self) -> Totals:
        by_kind: dict[str, dict[str, int]] = {"delete": {}, "move": {}, "copy": {}}
        usd_month: dict[str, float] = {}
        for item in self.items:
            a = item.action
            tier = (a.to_tier if a.kind == ActionKind.COPY else a.from_tier) or "?"
            bucket = by_kind[a.kind]
            bucket[tier] = bucket.get(tier, 0) + a.bytes
            for name, amount in item.storage or ():
                usd_month[name] = usd_month.get(name, 0.0) + amount
        return Totals(
            deleted_bytes_by_tier=by_kind["delete"],
            moved_bytes_by_tier=by_kind["move"],
            copied_bytes_by_tier=by_kind["copy"],
            usd_month_by_tier={name: amount + 0.0 for name, amount in usd_month.items()},
            one_off_usd=self.fees_usd(),
        )


def exceeds_blast_radius(delete_count: int, delete_bytes: int, total: tuple[int, int]) -> bool:
    """Deletes above half of a project's active checkpoints, by count or by bytes."""
    count, size = total
    return delete_count * 2 > count or delete_bytes * 2 > size


def _held(
    session: Session, loaded: Loaded | None, project: str, deletes: list[PlannedAction]
) -> bool:
    """Whether the project's new deletes exceed the blast radius. The project's active
    checkpoints in scope are a lower bound of all of them: deletes within half of those
    are within half of the project's, and a registration's prune skips summing the
    project's runs (a third of its time in a project of 10,000 runs)."""
    if not deletes:
        return False
    count, size = len(deletes), sum(a.bytes for a in deletes)
    lower_bound = loaded[1] if loaded is not None else None
    if lower_bound is not None and not exceeds_blast_radius(count, size, lower_bound):
        return False
    return exceeds_blast_radius(
        count, size, project_totals(session, [project]).get(project, (0, 0))
    )


def plan_catalog(
    session: Session,
    *,
    tiers: list[Tier],
    now: datetime,
    project: str | None = None,
    run_id: str | None = None,
    policy: Policy | None = None,
    explain: bool = True,
    projects: Collection[str] | None = None,
    trash_retention: timedelta | None = None,
    run_ids: Collection[str] | None = None,
    due: bool = False,
    shadows: bool = False,
    keep_read: bool = False,
    kept_as_json: bool = False,
) -> CatalogPlan:
    """What the policies (or the what-if `policy` for every run in scope) would do now.
    `projects` (a bounded caller's) narrows the whole catalog to those projects. Explained,
    a delete or move off a tier that bills deleted bytes says in its reason when its saving
    starts (after `trash_retention` and the tier's window; counted from the purge when None).
    `run_ids` (a periodic sweep's due runs) narrows it to those runs; with `due`, the plan
    also says when each run's plan can next change by the clock (`next_due`). With
    `shadows` (a sweep's), the plan also holds the new would-be actions of the shadow
    policies (`shadow`, app.services.lifecycle.shadow), and a run is next due when its
    governing policy's plan or a shadow policy's can change; a what-if `policy` has none.
    With `keep_read`, the plan holds what it read (`read`), freed with it. With
    `kept_as_json` (a caller that answers as JSON), the kept checkpoints of a split plan's
    other ranges arrive encoded (`kept_json`).
    Raises Invalid for an unknown run or for both a project and a run."""
    if project is not None and run_id is not None:
        raise Invalid("give project or run_id, not both", field="run_id")
    with gc_paused():
        return _plan(
            session,
            tiers=tiers,
            now=now,
            project=project,
            run_id=run_id,
            policy=policy,
            explain=explain,
            projects=projects,
            trash_retention=trash_retention,
            run_ids=run_ids,
            due=due,
            shadows=shadows,
            keep_read=keep_read,
            kept_as_json=kept_as_json,
        )


def _plan(
    session: Session,
    *,
    tiers: list[Tier],
    now: datetime,
    project: str | None,
    run_id: str | None,
    policy: Policy | None,
    explain: bool,
    projects: Collection[str] | None,
    trash_retention: timedelta | None,
    run_ids: Collection[str] | None,
    due: bool,
    shadows: bool,
    keep_read: bool,
    kept_as_json: bool,
) -> CatalogPlan:
    # The ledger first, then the catalog: each statement reads its own snapshot, and an
    # action that finishes in between is then still open here (and its checkpoint left
    # alone) rather than neither open nor visible in the catalog (and planned again).
    existing, failures = read_ledger(session, run_id)
    locks, purges_waiting = current_locks(
        session, now, project=project, run_id=run_id, projects=projects, run_ids=run_ids
    )
    policies = [] if policy is not None else active_policies(session, [t.name for t in tiers])
    inputs = PlanInputs(
        tiers=tiers,
        now=now,
        policy=policy,
        policies=policies,
        explain=explain,
        due=due,
        # Without a shadow policy (the usual case) a sweep does not pay for them per run.
        shadowing=shadows and any(not p.enforced for p in policies),
        failures=failures,
        locks=locks,
        trash_retention=trash_retention,
        kept_as_json=kept_as_json,
    )
    metrics = ranked_by([policy] if policy is not None else policies)
    # A whole catalog's or project's plan is split by runs across processes when it is
    # large (a shadow policy's plan reads what the plan read: then it is not split).
    ranges = (
        plan_ranges(session, project=project, projects=projects, explained=explain)
        if run_id is None and run_ids is None and not inputs.shadowing
        else None
    )
    if ranges is not None:
        scope, part = evaluate_in_parts(
            session, inputs, ranges, project=project, projects=projects, metrics=metrics
        )
    else:
        scope = load_scope(
            session,
            project=project,
            run_id=run_id,
            projects=projects,
            run_ids=run_ids,
            metrics=metrics,
        )
        if run_id is not None and not scope.runs:
            raise Invalid(f"no run has id {run_id!r}", field="run_id")
        part = evaluate_scope(inputs, scope)
        part.loaded = loaded_by_project(scope, deleting_projects(part))
    plan = CatalogPlan(
        kept=part.kept,
        kept_json=part.kept_json,
        skipped=purges_waiting + part.skipped,
        next_due=part.next_due,
        read=scope if keep_read else None,
    )
    costs, changes = part.costs, part.changes
    for project_name, actions in part.per_project.items():
        # Deletes already in the ledger were weighed by the evaluation that made them.
        deletes = [
            a
            for a in actions
            if a.kind == ActionKind.DELETE
            and (not existing or (a.checkpoint_id, a.kind, a.to_tier) not in existing)
        ]
        held = _held(session, part.loaded.get(project_name), project_name, deletes)
        if not existing and not costs:  # a sweep's plan with nothing open: no lookups
            deleting = "held" if held else "pending"
            plan.items.extend(
                PlanItem(a, deleting if a.kind == ActionKind.DELETE else "pending") for a in actions
            )
            continue
        for a in actions:
            key = (a.checkpoint_id, a.kind, a.to_tier)
            open_action = existing.get(key)
            cost, storage = costs.get(key), changes.get(key)
            if open_action is not None:
                plan.items.append(PlanItem(a, open_action.state, open_action.id, cost, storage))
            else:
                state = "held" if held and a.kind == ActionKind.DELETE else "pending"
                plan.items.append(PlanItem(a, state, cost=cost, storage=storage))
    if part.shadowed:
        plan.shadow = plan_shadows(
            session,
            scope=scope,
            shadowed=part.shadowed,
            narrow=lambda stmt: restrict(stmt, project, run_id, projects, run_ids),
            now=now,
            tiers=tiers,
            prices={t.name: effective_price(t) for t in tiers},
            locks=locks,
        )
    return plan
