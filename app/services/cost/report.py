"""Cost reports: what the catalog stores, grouped by tier, project, run or class, at each
tier's effective price. Trashed checkpoints still hold their bytes, so they are billed."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from app.cost.prices import PriceQuote, effective_price
from app.db.models import Checkpoint, Location, Project, Run
from app.domain.states import STORED_STATES, CheckpointState
from app.domain.tier import Tier

GroupBy = Literal["tier", "project", "run", "class"]
GROUPS: tuple[GroupBy, ...] = ("tier", "project", "run", "class")


@dataclass(frozen=True, slots=True)
class CostRow:
    key: str  # tier name, project name, run id or class
    bytes: int  # over every location: a replica is billed too
    checkpoints: int
    trashed_bytes: int  # part of `bytes` held by trashed checkpoints
    usd_month: float
    name: str | None = None  # a run's `<project>/<run name>`


@dataclass(frozen=True, slots=True)
class CostReport:
    group_by: GroupBy
    rows: tuple[CostRow, ...]
    prices: Mapping[str, PriceQuote]  # tier -> the price used

    @property
    def total_usd_month(self) -> float:
        return sum(r.usd_month for r in self.rows)

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)


def _keys(group_by: GroupBy) -> tuple[Any, ...]:
    """The grouping columns: the key first, then what names it."""
    if group_by == "tier":
        return (Location.tier,)
    if group_by == "project":
        return (Project.name,)
    if group_by == "run":
        return (Run.id, Project.name, Run.name)
    return (Checkpoint.klass,)


def _scoped(
    stmt: Select[Any], project: str | None, projects: Collection[str] | None
) -> Select[Any]:
    stmt = (
        stmt.join(Location, Location.checkpoint_id == Checkpoint.id)
        .join(Run, Run.id == Checkpoint.run_id)
        .join(Project, Project.id == Run.project_id)
        .where(Checkpoint.state.in_(STORED_STATES))
    )
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if projects is not None:
        stmt = stmt.where(Project.name.in_(sorted(projects)))
    return stmt


def cost_report(
    session: Session,
    *,
    tiers: Sequence[Tier],
    group_by: GroupBy = "tier",
    project: str | None = None,
    projects: Collection[str] | None = None,
) -> CostReport:
    """One row per group with bytes stored (every location of every `active` or `trashed`
    checkpoint), distinct checkpoints and USD a month at each tier's effective price; a tier
    no longer configured costs 0. `project` narrows to one project, `projects` (a bounded
    caller's) to those. Grouped by tier, every configured tier has a row, hottest first;
    otherwise rows come costliest first. Reads only."""
    keys = _keys(group_by)
    size = Checkpoint.size_bytes
    trashed = case((Checkpoint.state == CheckpointState.TRASHED, size), else_=0)
    by_tier = session.execute(
        _scoped(
            select(*keys, Location.tier, func.sum(size), func.sum(trashed)).select_from(Checkpoint),
            project,
            projects,
        ).group_by(*keys, Location.tier)
    ).all()
    counts = session.execute(
        _scoped(
            select(keys[0], func.count(func.distinct(Checkpoint.id))).select_from(Checkpoint),
            project,
            projects,
        ).group_by(keys[0])
    ).all()
    prices = {t.name: effective_price(t) for t in tiers}
    width = len(keys)
    totals: dict[str, list[Any]] = {}  # key -> [bytes, trashed, usd, name]
    for row in by_tier:
        key, tier, stored, in_trash = str(row[0]), row[width], int(row[width + 1] or 0), row[-1]
        entry = totals.setdefault(key, [0, 0, 0.0, "/".join(row[1:width]) or None])
        entry[0] += stored
        entry[1] += int(in_trash or 0)
        quote = prices.get(tier)
        entry[2] += quote.usd_month(stored) if quote is not None else 0.0
    checkpoints = {str(key): int(count) for key, count in counts}
    rows = [
        CostRow(key, stored, checkpoints.get(key, 0), in_trash, usd, name)
        for key, (stored, in_trash, usd, name) in totals.items()
    ]
    if group_by == "tier":
        rank = {t.name: t.rank for t in tiers}
        present = {r.key for r in rows}
        rows += [CostRow(t.name, 0, 0, 0, 0.0) for t in tiers if t.name not in present]
        rows.sort(key=lambda r: (rank.get(r.key, len(rank)), r.key))
    else:
        rows.sort(key=lambda r: (-r.usd_month, -r.bytes, r.key))
    return CostReport(group_by, tuple(rows), prices)
