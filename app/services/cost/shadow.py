"""`GET /v1/policies/{name}/shadow`: what a shadow policy would have done (its shadow
ledger), how that differs from what the policy in force did, and what people came back for
that it would have removed (DESIGN section 17). Reads only; works for a policy since
switched to `enforce`, whose history stays."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.cost.regrets import Regret, WouldBe, find_regrets
from app.db.models import Action, Checkpoint, Run, ShadowAction
from app.domain.plan import RunSnapshot
from app.domain.states import ActionKind
from app.domain.tier import Tier
from app.policy.engine import would_govern
from app.policy.schema import Mode
from app.services.catalog.policies import active_policies, get_policy_row
from app.services.catalog.runs import runs_in
from app.services.cost.inputs import tier_prices
from app.services.cost.shadow_queries import (
    POLICY_KINDS,
    freed,
    in_real_ledger,
    in_shadow_ledger,
    scoped,
)
from app.services.cost.uses import load_uses
from app.services.lifecycle.snapshot import read_runs, run_select

CHUNK = 5000  # ids per IN list


@dataclass(frozen=True, slots=True)
class Divergent:
    """An action one ledger has and the other lacks."""

    checkpoint_id: str
    run_id: str
    step: int
    kind: str
    from_tier: str | None
    to_tier: str | None
    rule: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ShadowReport:
    policy: str
    mode: Mode  # the policy's mode now
    actions: list[ShadowAction]
    bytes_freed: int
    usd_month: float
    only_shadow: list[Divergent]
    only_enforced: list[Divergent]
    regrets: list[Regret]


def shadow_report(
    session: Session,
    *,
    name: str,
    tiers: Sequence[Tier],
    since: datetime | None = None,
    projects: Collection[str] | None = None,
) -> ShadowReport:
    """The policy's would-be actions recorded at or after `since` (all without it) on runs
    of `projects` (every project when None), oldest first (then by run and step), with their
    divergence from the real ledger and their regrets. Raises NotFound for an unknown
    policy."""
    row = get_policy_row(session, name)
    shadow_rows = list(
        session.execute(
            scoped(select(ShadowAction), [name], since, projects).order_by(
                ShadowAction.created_at, ShadowAction.run_id, ShadowAction.step, ShadowAction.id
            )
        ).scalars()
    )
    bytes_freed, usd_month = freed(
        session, [name], tier_prices(tiers), since=since, projects=projects
    )[name]
    only_shadow = session.execute(
        scoped(select(ShadowAction.id), [name], since, projects).where(~in_real_ledger())
    ).scalars()
    lacking = set(only_shadow)
    would = [
        WouldBe(a.checkpoint_id, a.run_id, a.step, a.kind, a.created_at, a.to_tier)
        for a in shadow_rows
        if a.kind in (ActionKind.DELETE, ActionKind.MOVE)
    ]
    uses = load_uses(session, {w.checkpoint_id for w in would}, since=since)
    return ShadowReport(
        policy=name,
        mode="shadow" if row.document.get("mode") == "shadow" else "enforce",
        actions=shadow_rows,
        bytes_freed=bytes_freed,
        usd_month=usd_month,
        only_shadow=[_divergent(a) for a in shadow_rows if a.id in lacking],
        only_enforced=_only_enforced(session, name, tiers, since, projects),
        regrets=find_regrets(would, uses),
    )


def _divergent(a: ShadowAction) -> Divergent:
    return Divergent(
        a.checkpoint_id, a.run_id, a.step, a.kind, a.from_tier, a.to_tier, a.rule, a.created_at
    )


def _only_enforced(
    session: Session,
    name: str,
    tiers: Sequence[Tier],
    since: datetime | None,
    projects: Collection[str] | None,
) -> list[Divergent]:
    """The real ledger's rule-planned deletes, moves and copies (at or after `since`) on the
    runs the policy would govern now that it has no would-be action of the same checkpoint,
    kind and target for. A policy that no longer validates governs nothing here."""
    policies = active_policies(session, [t.name for t in tiers])
    policy = next((p for p in policies if p.name == name), None)
    if policy is None:
        return []
    stmt = (
        select(
            Action.checkpoint_id,
            Action.run_id,
            Checkpoint.step,
            Action.kind,
            Action.from_tier,
            Action.to_tier,
            Action.rule,
            Action.created_at,
        )
        .join(Checkpoint, Checkpoint.id == Action.checkpoint_id)
        .where(Action.rule != "manual", Action.kind.in_(POLICY_KINDS), ~in_shadow_ledger(name))
        .order_by(Action.created_at, Action.id)
    )
    if since is not None:
        stmt = stmt.where(Action.created_at >= since)
    if projects is not None:
        stmt = stmt.where(Action.run_id.in_(runs_in(projects)))
    found = [Divergent(*r) for r in session.execute(stmt)]
    runs = _runs(session, {d.run_id for d in found})
    governed = {r.id for r in runs if would_govern(policy, policies, r)}
    return [d for d in found if d.run_id in governed]


def _runs(session: Session, ids: Collection[str]) -> Iterator[RunSnapshot]:
    """The runs as the policy selection reads them."""
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        chunk = ordered[start : start + CHUNK]
        yield from read_runs(session, run_select().where(Run.id.in_(chunk)), many=True)
