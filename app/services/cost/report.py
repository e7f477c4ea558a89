"""Cost reports: what the catalog stores, grouped by tier, project, run or class, at each
tier's effective price. Trashed checkpoints still hold their bytes, so they are billed; and
bytes the service removed from a tier whose provider keeps them (GCS soft delete, noncurrent
versions a lifecycle rule expires later, DESIGN section 16) are billed until the provider
lets go of them, so they are rows of their own kind: the bill, not the catalog, decides."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session

from app.cost.prices import PriceQuote, effective_price
from app.db.models import Checkpoint, DeletedBytes, Location, Project, Run
from app.domain.states import STORED_STATES, CheckpointState
from app.domain.tier import Tier

GroupBy = Literal["tier", "project", "run", "class"]
GROUPS: tuple[GroupBy, ...] = ("tier", "project", "run", "class")
# `stored`: bytes of `active` and `trashed` checkpoints; `deleted_billed`: bytes the service
# removed that the tier's provider still keeps and bills.
RowKind = Literal["stored", "deleted_billed"]


@dataclass(frozen=True, slots=True)
class CostRow:
    key: str  # tier name, project name, run id or class
    bytes: int  # over every location: a replica is billed too
    checkpoints: int
    trashed_bytes: int  # part of `bytes` held by trashed checkpoints
    usd_month: float
    name: str | None = None  # a run's `<project>/<run name>`
    kind: RowKind = "stored"
    # deleted_billed rows: when the last of their bytes stops being billed; None when some
    # are billed for ever (noncurrent versions nothing expires), and on stored rows.
    billed_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class CostReport:
    group_by: GroupBy
    rows: tuple[CostRow, ...]
    prices: Mapping[str, PriceQuote]  # tier -> the price used

    @property
    def total_usd_month(self) -> float:
        """Every row, deleted_billed ones included: what the provider bills a month."""
        return sum(r.usd_month for r in self.rows)

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def deleted_billed_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.kind == "deleted_billed")

    @property
    def deleted_billed_usd_month(self) -> float:
        return sum(r.usd_month for r in self.rows if r.kind == "deleted_billed")


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
    now: datetime,
    group_by: GroupBy = "tier",
    project: str | None = None,
    projects: Collection[str] | None = None,
) -> CostReport:
    """One row per group with bytes stored (every location of every `active` or `trashed`
    checkpoint), distinct checkpoints and USD a month at each tier's effective price; a tier
    no longer configured costs 0. `project` narrows to one project, `projects` (a bounded
    caller's) to those. Grouped by tier, every configured tier has a row, hottest first;
    otherwise rows come costliest first. After the stored rows, one `deleted_billed` row per
    group whose removed bytes the provider still bills at `now` (see deleted_billed_rows).
    Reads only."""
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
    rank = {t.name: t.rank for t in tiers}
    if group_by == "tier":
        present = {r.key for r in rows}
        rows += [CostRow(t.name, 0, 0, 0, 0.0) for t in tiers if t.name not in present]
        rows.sort(key=lambda r: (rank.get(r.key, len(rank)), r.key))
    else:
        rows.sort(key=lambda r: (-r.usd_month, -r.bytes, r.key))
    billed = deleted_billed_rows(
        session, prices=prices, now=now, group_by=group_by, project=project, projects=projects
    )
    if group_by == "tier":
        billed.sort(key=lambda r: (rank.get(r.key, len(rank)), r.key))
    return CostReport(group_by, (*rows, *billed), prices)


def _deleted_keys(group_by: GroupBy) -> tuple[Any, ...]:
    if group_by == "tier":
        return (DeletedBytes.tier,)
    if group_by == "project":
        return (DeletedBytes.project,)
    if group_by == "run":
        return (DeletedBytes.run_id, Project.name, Run.name)
    return (DeletedBytes.klass,)


def deleted_billed_rows(
    session: Session,
    *,
    prices: Mapping[str, PriceQuote],
    now: datetime,
    group_by: GroupBy,
    project: str | None = None,
    projects: Collection[str] | None = None,
) -> list[CostRow]:
    """The `deleted_billed` rows: bytes of removed locations (`deleted_bytes`, written by a
    purge or a move's source removal) still billed at `now` (`billed_until` later, or NULL:
    for ever), grouped as the stored rows are and priced at their tier's price (0 for a tier
    no longer configured). Only groups with such bytes have a row, costliest first. Reads
    only."""
    keys = _deleted_keys(group_by)
    scope = [or_(DeletedBytes.billed_until.is_(None), DeletedBytes.billed_until > now)]
    if project is not None:
        scope.append(DeletedBytes.project == project)
    if projects is not None:
        scope.append(DeletedBytes.project.in_(sorted(projects)))
    # max() skips NULLs: count the rows billed for ever apart.
    for_ever = func.sum(case((DeletedBytes.billed_until.is_(None), 1), else_=0))
    stmt = select(
        *keys,
        DeletedBytes.tier,
        func.sum(DeletedBytes.bytes),
        func.max(DeletedBytes.billed_until),
        for_ever,
    ).where(*scope)
    if group_by == "run":  # the run's name beside its id
        stmt = stmt.outerjoin(Run, Run.id == DeletedBytes.run_id).outerjoin(
            Project, Project.id == Run.project_id
        )
    counted = select(keys[0], func.count(func.distinct(DeletedBytes.checkpoint_id))).where(*scope)
    checkpoints = {
        str(key): int(count) for key, count in session.execute(counted.group_by(keys[0]))
    }
    width = len(keys)
    groups: dict[str, _Billed] = {}
    for row in session.execute(stmt.group_by(*keys, DeletedBytes.tier)):
        key, tier, size = str(row[0]), row[width], int(row[width + 1] or 0)
        names = [str(n) for n in row[1:width] if n is not None]
        group = groups.setdefault(key, _Billed("/".join(names) if len(names) == 2 else None))
        group.bytes += size
        quote = prices.get(tier)
        group.usd += quote.usd_month(size) if quote is not None else 0.0
        group.for_ever = group.for_ever or int(row[width + 3] or 0) > 0
        until = row[width + 2]
        if until is not None and (group.until is None or until > group.until):
            group.until = until
    rows = [
        CostRow(
            key,
            g.bytes,
            checkpoints.get(key, 0),
            0,
            g.usd,
            g.name,
            kind="deleted_billed",
            billed_until=None if g.for_ever else g.until,
        )
        for key, g in groups.items()
    ]
    rows.sort(key=lambda r: (-r.usd_month, -r.bytes, r.key))
    return rows


@dataclass(slots=True)
class _Billed:
    name: str | None
    bytes: int = 0
    usd: float = 0.0
    until: datetime | None = None
    for_ever: bool = False
