"""Read the catalog into the engine's plain data, in a few set-based queries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Location, Project, Run
from app.domain.plan import CheckpointSnapshot, RunSnapshot


@dataclass
class Scope:
    """What one evaluation looks at."""

    runs: list[RunSnapshot]
    checkpoints: dict[str, list[CheckpointSnapshot]]  # run id -> active checkpoints
    resumed_by_active: set[str]
    project_totals: dict[str, tuple[int, int]] = field(default_factory=dict)  # count, bytes


def load_scope(session: Session, *, project: str | None = None, run_id: str | None = None) -> Scope:
    """Runs in scope (one run, one project, or the whole catalog) with their active
    checkpoints, the checkpoints active runs resumed from, and per-project totals of
    active checkpoints (the blast-radius base)."""
    run_stmt = select(
        Run.id,
        Project.name,
        Run.name,
        Run.status,
        Run.labels,
        Run.policy,
        Run.resumed_from,
        Run.ended_at,
    ).join(Project, Project.id == Run.project_id)
    ckpt_stmt = select(
        Checkpoint.id,
        Checkpoint.run_id,
        Checkpoint.step,
        Checkpoint.klass,
        Checkpoint.size_bytes,
        Checkpoint.created_at,
        Checkpoint.metrics,
        Checkpoint.pinned,
    ).where(Checkpoint.state == "active")
    loc_stmt = (
        select(Location.checkpoint_id, Location.tier, Location.role)
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(Checkpoint.state == "active")
    )
    if run_id is not None:
        run_stmt = run_stmt.where(Run.id == run_id)
        ckpt_stmt = ckpt_stmt.where(Checkpoint.run_id == run_id)
        loc_stmt = loc_stmt.where(Checkpoint.run_id == run_id)
    elif project is not None:
        run_ids = select(Run.id).join(Project).where(Project.name == project)
        run_stmt = run_stmt.where(Project.name == project)
        ckpt_stmt = ckpt_stmt.where(Checkpoint.run_id.in_(run_ids))
        loc_stmt = loc_stmt.where(Checkpoint.run_id.in_(run_ids))
    runs = [
        RunSnapshot(
            id=r[0],
            project=r[1],
            name=r[2],
            status=r[3],
            labels=r[4] or {},
            policy=r[5],
            resumed_from=r[6],
            ended_at=r[7],
        )
        for r in session.execute(run_stmt)
    ]
    primary: dict[str, str] = {}
    held_on: dict[str, set[str]] = defaultdict(set)
    for checkpoint_id, tier, role in session.execute(loc_stmt):
        held_on[checkpoint_id].add(tier)
        if role == "primary":
            primary[checkpoint_id] = tier
    by_run: dict[str, list[CheckpointSnapshot]] = defaultdict(list)
    for c in session.execute(ckpt_stmt):
        by_run[c[1]].append(
            CheckpointSnapshot(
                id=c[0],
                run_id=c[1],
                step=c[2],
                klass=c[3],
                state="active",
                size_bytes=c[4],
                created_at=c[5],
                tier=primary.get(c[0]),
                tiers=frozenset(held_on.get(c[0], ())),
                metrics=c[6] or {},
                pinned=c[7],
            )
        )
    resumed = {
        cid
        for cid in session.execute(
            select(Run.resumed_from).where(Run.status == "active", Run.resumed_from.is_not(None))
        ).scalars()
        if cid is not None
    }
    projects = {r.project for r in runs}
    totals_stmt = (
        select(Project.name, func.count(), func.coalesce(func.sum(Checkpoint.size_bytes), 0))
        .select_from(Checkpoint)
        .join(Run, Run.id == Checkpoint.run_id)
        .join(Project, Project.id == Run.project_id)
        .where(Checkpoint.state == "active")
        .group_by(Project.name)
    )
    if len(projects) == 1:
        totals_stmt = totals_stmt.where(Project.name == next(iter(projects)))
    totals = {
        name: (int(count), int(size))
        for name, count, size in session.execute(totals_stmt)
        if name in projects
    }
    return Scope(
        runs=runs, checkpoints=dict(by_run), resumed_by_active=resumed, project_totals=totals
    )
