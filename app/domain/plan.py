"""Plain data the policy engine reads (snapshots) and writes (plans)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    id: str
    project: str
    name: str
    status: str  # active | completed | failed
    labels: Mapping[str, str] = field(default_factory=dict)
    policy: str | None = None
    resumed_from: str | None = None
    ended_at: datetime | None = None
    # When the run's plan can next change by the clock (policy.due): read with the run, so
    # an evaluation writes its new value only if nothing marked the run since.
    next_due_at: datetime | None = None


class CheckpointSnapshot(NamedTuple):
    """A tuple, not a dataclass: a full sweep builds a million of these."""

    id: str
    run_id: str
    step: int
    klass: str
    state: str  # writing | active | trashed | deleted
    size_bytes: int
    created_at: datetime
    tier: str | None  # the primary location's tier
    tiers: frozenset[str] = frozenset()  # every tier holding a location
    metrics: Mapping[str, float] = MappingProxyType({})
    pinned: bool = False
    protected_until: datetime | None = None  # set by an undelete


# Tuples, as the snapshots are: a plan of a million checkpoints makes hundreds of thousands
# of each, and a frozen dataclass sets every field through object.__setattr__ (about four
# times the cost of a tuple's construction).


class PlannedAction(NamedTuple):
    checkpoint_id: str
    run_id: str
    step: int
    kind: str  # delete | move | copy
    from_tier: str | None
    to_tier: str | None
    rule: str  # <policy>/<rule>
    reason: str
    bytes: int


class Kept(NamedTuple):
    checkpoint_id: str
    step: int
    reasons: tuple[str, ...]


class Skipped(NamedTuple):
    checkpoint_id: str
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[PlannedAction, ...] = ()
    kept: tuple[Kept, ...] = ()
    skipped: tuple[Skipped, ...] = ()
