"""Plain typed builders for the pure policy engine: runs, checkpoints, policies and plans.

No I/O and no clock: every time is derived from the fixed `NOW`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.plan import CheckpointSnapshot, Plan, PlannedAction, RunSnapshot
from app.policy.engine import evaluate
from app.policy.schema import Policy

TIERS: tuple[str, ...] = ("hot", "warm", "cold", "archive")
TIER_RANKS: dict[str, int] = {name: rank for rank, name in enumerate(TIERS)}
NOW = datetime(2026, 6, 15, 12, 0, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=365)  # far beyond every grace period and `age` used in tests


def make_run(
    run_id: str = "run-1",
    *,
    project: str = "proj",
    name: str | None = None,
    status: str = "completed",
    labels: Mapping[str, str] | None = None,
    policy: str | None = None,
    resumed_from: str | None = None,
    ended_at: datetime | None = None,
    ended_ago: timedelta | None = None,
) -> RunSnapshot:
    """A run; a finished run ends 100 days before NOW unless told otherwise."""
    if ended_at is None and status != "active":
        ended_at = NOW - (ended_ago if ended_ago is not None else timedelta(days=100))
    return RunSnapshot(
        id=run_id,
        project=project,
        name=name or run_id,
        status=status,
        labels=dict(labels or {}),
        policy=policy,
        resumed_from=resumed_from,
        ended_at=ended_at,
    )


def make_checkpoint(
    step: int,
    *,
    run_id: str = "run-1",
    klass: str = "rolling",
    state: str = "active",
    size_bytes: int = 1000,
    created_at: datetime | None = None,
    age: timedelta | None = None,
    tier: str | None = "hot",
    replicas: Sequence[str] = (),
    metrics: Mapping[str, float] | None = None,
    pinned: bool = False,
    checkpoint_id: str | None = None,
) -> CheckpointSnapshot:
    """A checkpoint with id `<run>-<step>`; created long before NOW unless told otherwise.

    `tiers` holds the primary tier plus `replicas`, as the catalog reports it.
    """
    if created_at is None:
        created_at = NOW - age if age is not None else OLD + timedelta(seconds=step)
    tiers = frozenset([*([tier] if tier is not None else []), *replicas])
    return CheckpointSnapshot(
        id=checkpoint_id or f"{run_id}-{step}",
        run_id=run_id,
        step=step,
        klass=klass,
        state=state,
        size_bytes=size_bytes,
        created_at=created_at,
        tier=tier,
        tiers=tiers,
        metrics=dict(metrics or {}),
        pinned=pinned,
    )


def make_checkpoints(steps: Sequence[int], **options: Any) -> list[CheckpointSnapshot]:
    return [make_checkpoint(step, **options) for step in steps]


def make_policy(
    data: Mapping[str, Any] | None = None,
    *,
    rules: Sequence[Mapping[str, Any]] | None = None,
    name: str = "pol",
    tiers: Sequence[str] = TIERS,
) -> Policy:
    """A validated policy from a dict (as YAML would give), or from `rules` alone."""
    raw: dict[str, Any] = dict(data) if data is not None else {"name": name}
    if rules is not None:
        raw["rules"] = [dict(rule) for rule in rules]
    return Policy.model_validate(raw, context={"tiers": list(tiers)})


def rule(name: str = "r", action: Any = "delete", **fields: Any) -> dict[str, Any]:
    """A rule dict; pass `klass=` for the YAML field `class`."""
    out: dict[str, Any] = {"name": name}
    if "klass" in fields:
        out["class"] = fields.pop("klass")
    out.update(fields)
    out["action"] = action
    return out


def plan_for(
    policy: Policy,
    run: RunSnapshot,
    checkpoints: Sequence[CheckpointSnapshot],
    *,
    now: datetime = NOW,
    resumed_by_active: Sequence[str] = (),
) -> Plan:
    return evaluate(
        policy,
        run,
        checkpoints,
        now,
        tier_ranks=TIER_RANKS,
        resumed_by_active=resumed_by_active,
    )


def actions_of(plan: Plan, kind: str) -> list[PlannedAction]:
    return [a for a in plan.actions if a.kind == kind]


def deleted_steps(plan: Plan) -> set[int]:
    return {a.step for a in plan.actions if a.kind == "delete"}


def deleted_ids(plan: Plan) -> set[str]:
    return {a.checkpoint_id for a in plan.actions if a.kind == "delete"}


def moves(plan: Plan) -> dict[int, str | None]:
    return {a.step: a.to_tier for a in plan.actions if a.kind == "move"}


def copies(plan: Plan) -> set[tuple[int, str | None]]:
    return {(a.step, a.to_tier) for a in plan.actions if a.kind == "copy"}


def kept_steps(plan: Plan) -> set[int]:
    return {k.step for k in plan.kept}


def kept_reasons(plan: Plan, checkpoint_id: str) -> tuple[str, ...]:
    for kept in plan.kept:
        if kept.checkpoint_id == checkpoint_id:
            return kept.reasons
    raise AssertionError(f"{checkpoint_id} is not in the plan's kept list")
