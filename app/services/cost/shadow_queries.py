"""The shadow ledger set against reality, in aggregate SQL: what a shadow policy would have
freed that the policy in force has not, its would-be actions that reality lacks, and the
figures `/metrics` shows per shadow policy at each scrape (one grouped statement each,
whatever the size of the catalog). The report of `GET /v1/policies/{name}/shadow`
(app.services.cost.shadow) reads through the same statements, so both say the same.

Definitions (DESIGN section 17):
- freed: a would-be delete of a checkpoint still `active` or `trashed` (billed): its bytes,
  and their price a month at each real location's tier;
- a would-be move of an `active` checkpoint whose primary is still on the move's source tier
  (and that the policy would not delete): the monthly price of the source less the target;
- only shadow: a would-be action with no action of the same checkpoint, kind and target in
  the real ledger, in any state, whoever asked for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, case, exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from app.cost.prices import PriceQuote
from app.db.models import Action, AuditEvent, Checkpoint, Location, Run, ShadowAction
from app.domain.states import STORED_STATES, ActionKind, CheckpointState, LocationRole
from app.domain.tier import Tier
from app.services.catalog.policies import active_policies
from app.services.catalog.runs import runs_in
from app.services.cost.inputs import tier_prices

POLICY_KINDS = (ActionKind.DELETE, ActionKind.MOVE, ActionKind.COPY)

Stmt = TypeVar("Stmt", bound=Select[*tuple[Any, ...]])


def scoped(
    stmt: Stmt,
    names: Collection[str],
    since: datetime | None = None,
    projects: Collection[str] | None = None,
) -> Stmt:
    """`stmt` on shadow_actions narrowed to the policies `names`, recorded at or after
    `since`, on runs of `projects` (a bounded caller's)."""
    stmt = stmt.where(ShadowAction.policy.in_(sorted(names)))
    if since is not None:
        stmt = stmt.where(ShadowAction.created_at >= since)
    if projects is not None:
        stmt = stmt.where(ShadowAction.run_id.in_(runs_in(projects)))
    return stmt


def _same_target(a: Any, b: Any) -> ColumnElement[bool]:
    return or_(a == b, and_(a.is_(None), b.is_(None)))


def in_real_ledger() -> ColumnElement[bool]:
    """The shadow row has an action of the same checkpoint, kind and target in `actions`."""
    return exists(
        select(1).where(
            Action.checkpoint_id == ShadowAction.checkpoint_id,
            Action.kind == ShadowAction.kind,
            _same_target(Action.to_tier, ShadowAction.to_tier),
        )
    )


def in_shadow_ledger(name: str) -> ColumnElement[bool]:
    """The real action has a would-be action of the same checkpoint, kind and target among
    the policy `name`'s."""
    return exists(
        select(1).where(
            ShadowAction.policy == name,
            ShadowAction.checkpoint_id == Action.checkpoint_id,
            ShadowAction.kind == Action.kind,
            _same_target(ShadowAction.to_tier, Action.to_tier),
        )
    )


def freed(
    session: Session,
    names: Collection[str],
    prices: Mapping[str, PriceQuote],
    *,
    since: datetime | None = None,
    projects: Collection[str] | None = None,
) -> dict[str, tuple[int, float]]:
    """Per policy: (bytes its would-be deletes would have freed that are still billed, USD a
    month those cost plus what its would-be moves not yet made would save)."""
    size = Checkpoint.size_bytes
    primary = case((Location.role == LocationRole.PRIMARY, size), else_=0)
    deletes = scoped(
        select(ShadowAction.policy, Location.tier, func.sum(size), func.sum(primary))
        .join(Checkpoint, Checkpoint.id == ShadowAction.checkpoint_id)
        .join(Location, Location.checkpoint_id == Checkpoint.id)
        .where(ShadowAction.kind == ActionKind.DELETE, Checkpoint.state.in_(STORED_STATES))
        .group_by(ShadowAction.policy, Location.tier),
        names,
        since,
        projects,
    )
    found: dict[str, tuple[int, float]] = dict.fromkeys(names, (0, 0.0))
    for policy, tier, stored, once in session.execute(deletes):
        quote = prices.get(tier)
        usd = quote.usd_month(int(stored or 0)) if quote is not None else 0.0
        held, total = found[policy]
        found[policy] = (held + int(once or 0), total + usd)
    deleted = aliased(ShadowAction)
    moves = scoped(
        select(ShadowAction.policy, ShadowAction.from_tier, ShadowAction.to_tier, func.sum(size))
        .join(Checkpoint, Checkpoint.id == ShadowAction.checkpoint_id)
        .join(
            Location,
            and_(
                Location.checkpoint_id == Checkpoint.id,
                Location.role == LocationRole.PRIMARY,
                Location.tier == ShadowAction.from_tier,
            ),
        )
        .where(
            ShadowAction.kind == ActionKind.MOVE,
            Checkpoint.state == CheckpointState.ACTIVE,
            ~exists(
                select(1).where(
                    deleted.policy == ShadowAction.policy,
                    deleted.checkpoint_id == ShadowAction.checkpoint_id,
                    deleted.kind == ActionKind.DELETE,
                )
            ),
        )
        .group_by(ShadowAction.policy, ShadowAction.from_tier, ShadowAction.to_tier),
        names,
        since,
        projects,
    )
    for policy, source, target, moved in session.execute(moves):
        was, will = prices.get(source or ""), prices.get(target or "")
        if was is None or will is None:
            continue
        held, total = found[policy]
        found[policy] = (
            held,
            total + was.usd_month(int(moved or 0)) - will.usd_month(int(moved or 0)),
        )
    return found


def count_only_shadow(session: Session, names: Collection[str]) -> dict[str, int]:
    """Per policy, its would-be actions the real ledger has no counterpart of."""
    stmt = scoped(
        select(ShadowAction.policy, func.count()).where(~in_real_ledger()),
        names,
    ).group_by(ShadowAction.policy)
    found = dict.fromkeys(names, 0)
    found.update({policy: int(n) for policy, n in session.execute(stmt)})
    return found


def count_only_enforced(session: Session, names: Collection[str]) -> dict[str, int]:
    """Per policy, the rule-planned deletes, moves and copies of the real ledger that it
    has no would-be counterpart of, on the runs it has recorded would-be actions for: the
    scrape's bound on "the runs it governs" (the report's `only_enforced` asks the policy
    selection itself, run by run, which is too much work for every scrape)."""
    found = dict.fromkeys(names, 0)
    for name in names:
        mine = select(ShadowAction.run_id).where(ShadowAction.policy == name)
        stmt = select(func.count()).where(
            Action.rule != "manual",
            Action.kind.in_(POLICY_KINDS),
            Action.run_id.in_(mine),
            ~in_shadow_ledger(name),
        )
        found[name] = int(session.execute(stmt).scalar_one())
    return found


def count_regrets(session: Session, names: Collection[str]) -> dict[str, int]:
    """Per policy, the checkpoints it would have deleted or moved that were used after
    (app.cost.regrets: a restore or a resume after a would-be delete or move, a pin after a
    would-be delete): len(find_regrets(...)) of the whole history, in one statement."""
    at = ShadowAction.created_at
    restored = exists(
        select(1).where(
            Action.checkpoint_id == ShadowAction.checkpoint_id,
            Action.kind == ActionKind.RESTORE,
            Action.created_at > at,
        )
    )
    resumed = exists(
        select(1).where(Run.resumed_from == ShadowAction.checkpoint_id, Run.started_at > at)
    )
    pinned = exists(
        select(1).where(
            AuditEvent.checkpoint_id == ShadowAction.checkpoint_id,
            AuditEvent.entity == "checkpoint",
            AuditEvent.event == "pinned",
            AuditEvent.at > at,
        )
    )
    stmt = scoped(
        select(ShadowAction.policy, func.count(func.distinct(ShadowAction.checkpoint_id))).where(
            ShadowAction.kind.in_((ActionKind.DELETE, ActionKind.MOVE)),
            or_(restored, resumed, and_(ShadowAction.kind == ActionKind.DELETE, pinned)),
        ),
        names,
    ).group_by(ShadowAction.policy)
    found = dict.fromkeys(names, 0)
    found.update({policy: int(n) for policy, n in session.execute(stmt)})
    return found


@dataclass(frozen=True, slots=True)
class ShadowFigures:
    """What `/metrics` shows of one shadow policy, over its whole history."""

    bytes_freed: int
    usd_month: float
    only_shadow: int
    only_enforced: int
    regrets: int


def shadow_figures(session: Session, tiers: Sequence[Tier]) -> dict[str, ShadowFigures]:
    """Per policy now in shadow mode, its figures; nothing read beyond the policies when
    there is none."""
    names = [p.name for p in active_policies(session, [t.name for t in tiers]) if not p.enforced]
    if not names:
        return {}
    money = freed(session, names, tier_prices(tiers))
    only_shadow = count_only_shadow(session, names)
    only_enforced = count_only_enforced(session, names)
    regrets = count_regrets(session, names)
    return {
        name: ShadowFigures(*money[name], only_shadow[name], only_enforced[name], regrets[name])
        for name in names
    }
