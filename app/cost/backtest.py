"""A backtest: the catalog's own history replayed through the policy engine under a
candidate policy (section 17), the way the forecast replays simulated checkpoints.

The history is what happened to the runs and checkpoints, as events in time order: a run
starts (perhaps `resumed_from` a checkpoint) and ends, a checkpoint appears (registered
at its `created_at`, or committed), is pinned or unpinned, deleted or undeleted by a
person, restored onto a tier. The candidate sees all of them and decides the rest itself:
the deletes, moves and copies the policy in force made are not replayed, the candidate's
own are. It is evaluated after every event of a run and at each day boundary, as the
service evaluates; a day-boundary evaluation is left out when nothing but the clock moved
and no time condition came due (app.policy.due), which changes no action. Held deletes
count as approved; a deleted checkpoint stays billed in the trash for the retention.

What the candidate stores is written as changes of bytes per tier (`Delta`), which
app.cost.usage_series turns into the day-by-day series and the total, the same way it
does for what actually happened.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from app.cost.regrets import WouldBe
from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.policy.due import next_change
from app.policy.engine import evaluate
from app.policy.schema import Policy

# Event kinds, in the order they apply at one instant: a run starts before its
# checkpoints appear; a person's change applies before the run ends.
RUN_STARTED, APPEARED, PINNED, UNPINNED, DELETED, UNDELETED, RESTORED, RUN_ENDED = range(8)


@dataclass(frozen=True, slots=True)
class Event:
    at: datetime
    kind: int
    run_id: str
    checkpoint_id: str | None = None
    tier: str | None = None  # RESTORED: onto which tier
    purged_at: datetime | None = None  # DELETED: when its bytes went (None: retention)


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """What the replay knows of a checkpoint beyond its events: as the catalog has it now
    (class and metrics are taken as they are today), and the tier it was written to."""

    id: str
    run_id: str
    step: int
    klass: str
    size_bytes: int
    created_at: datetime
    tier: str
    metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Delta:
    at: datetime
    tier: str
    bytes: int  # added (> 0) or removed (< 0)


@dataclass(slots=True)
class Outcome:
    deltas: list[Delta]
    would: list[WouldBe]  # every delete and move the candidate made, in time order
    actions: int = 0
    evaluations: int = 0


class Backtest:
    """The candidate's replay over a set of runs (those it would govern)."""

    def __init__(
        self,
        policy: Policy,
        runs: Sequence[RunSnapshot],
        checkpoints: Sequence[CheckpointFacts],
        *,
        tier_ranks: Mapping[str, int],
        trash_retention: timedelta,
    ) -> None:
        self.policy = policy
        self.ranks = tier_ranks
        self.retention = trash_retention
        self.facts = {c.id: c for c in checkpoints}
        self.final = {r.id: r for r in runs}  # as the runs ended up
        self.runs: dict[str, RunSnapshot] = {}  # as the replay has them: started, active
        self.live: dict[str, dict[str, CheckpointSnapshot]] = {}  # run -> id -> checkpoint
        self.resumed_by_active: dict[str, set[str]] = {}  # checkpoint -> active runs
        self.next_due: list[tuple[datetime, str]] = []  # (when, run) a heap
        self.dirty: set[str] = set()  # runs whose plan may differ from their last one
        self.trash: dict[str, tuple[datetime, CheckpointSnapshot]] = {}  # manual deletes
        self.out = Outcome([], [])
        rules = policy.rules
        self.selects_all = any(r.classes is None for r in rules)
        self.selected = frozenset(k for r in rules for k in r.classes or ())

    def play(self, events: Sequence[Event], until: datetime) -> Outcome:
        ordered = sorted(events, key=lambda e: (e.at, e.kind))
        if not ordered:
            return self.out
        boundary = _next_midnight(ordered[0].at)
        for event in ordered:
            if event.at > until:
                break
            while boundary <= event.at:
                self._day(boundary)
                boundary += timedelta(days=1)
            self._apply(event)
        while boundary <= until:
            self._day(boundary)
            boundary += timedelta(days=1)
        return self.out

    # --- events ------------------------------------------------------------------------

    def _apply(self, e: Event) -> None:
        run = e.run_id
        if e.kind == RUN_STARTED:
            final = self.final[run]
            self.runs[run] = replace(final, status="active", ended_at=None)
            self.live.setdefault(run, {})
            if final.resumed_from is not None:
                self.resumed_by_active.setdefault(final.resumed_from, set()).add(run)
                self._touch_owner_of(final.resumed_from)
        elif e.kind == RUN_ENDED:
            final = self.final[run]
            self.runs[run] = replace(final, ended_at=e.at)
            if final.resumed_from is not None:
                self.resumed_by_active.get(final.resumed_from, set()).discard(run)
                self._touch_owner_of(final.resumed_from)
        elif e.checkpoint_id is not None:
            self._checkpoint_event(e, e.checkpoint_id)
        if run in self.runs:
            self._evaluate(run, e.at)

    def _checkpoint_event(self, e: Event, checkpoint_id: str) -> None:
        live = self.live.setdefault(e.run_id, {})
        c = live.get(checkpoint_id)
        if e.kind == APPEARED:
            f = self.facts[checkpoint_id]
            c = CheckpointSnapshot(
                id=f.id,
                run_id=f.run_id,
                step=f.step,
                klass=f.klass,
                state="active",
                size_bytes=f.size_bytes,
                created_at=f.created_at,
                tier=f.tier,
                tiers=frozenset({f.tier}),
                metrics=f.metrics,
            )
            live[f.id] = c
            self._add(e.at, c.tiers, c.size_bytes)
        elif c is None:
            if e.kind == UNDELETED and checkpoint_id in self.trash:
                purge, was = self.trash.pop(checkpoint_id)
                self._add(purge, was.tiers, was.size_bytes)  # its purge will not come
                live[checkpoint_id] = was._replace(protected_until=e.at + self.retention)
        elif e.kind in (PINNED, UNPINNED):
            live[c.id] = c._replace(pinned=e.kind == PINNED)
        elif e.kind == DELETED:  # a person's delete: the bytes stay in the trash until purged
            del live[c.id]
            purge = e.purged_at or e.at + self.retention
            self.trash[c.id] = (purge, c)
            self._remove(purge, c.tiers, c.size_bytes)
        elif e.kind == UNDELETED:
            live[c.id] = c._replace(protected_until=e.at + self.retention)
        elif e.kind == RESTORED and e.tier is not None and e.tier not in c.tiers:
            live[c.id] = c._replace(tiers=c.tiers | {e.tier})
            self._add(e.at, frozenset({e.tier}), c.size_bytes)

    def _touch_owner_of(self, checkpoint_id: str) -> None:
        facts = self.facts.get(checkpoint_id)
        if facts is not None and facts.run_id in self.runs:
            self.dirty.add(facts.run_id)

    # --- evaluation --------------------------------------------------------------------

    def _day(self, boundary: datetime) -> None:
        due = set(self.dirty)
        while self.next_due and self.next_due[0][0] <= boundary:
            due.add(heapq.heappop(self.next_due)[1])
        for run in sorted(due):
            self._evaluate(run, boundary)

    def _evaluate(self, run_id: str, now: datetime) -> None:
        self.dirty.discard(run_id)
        run = self.runs[run_id]
        members = self.live.get(run_id, {})
        if not members:
            return
        if self.selects_all:
            watched = list(members.values())
        else:
            watched = [c for c in members.values() if c.klass in self.selected]
            newest = max(members.values(), key=lambda c: c.step)
            if watched and newest.klass not in self.selected:
                watched.append(newest)  # the resume point the engine protects
        if not watched:
            return
        self.out.evaluations += 1
        resumed = [c.id for c in watched if self.resumed_by_active.get(c.id)]
        plan = evaluate(
            self.policy,
            run,
            watched,
            now,
            tier_ranks=self.ranks,
            resumed_by_active=resumed,
            explain=False,
            live_only=True,
        )
        for action in plan.actions:
            self._act(action.kind, members[action.checkpoint_id], action.to_tier, now)
        if plan.actions:
            self.dirty.add(run_id)  # once more at the next boundary, as a sweep would
            return
        later = next_change(self.policy, run, watched, now)
        if later is not None:
            heapq.heappush(self.next_due, (later, run_id))

    def _act(self, kind: str, c: CheckpointSnapshot, to: str | None, now: datetime) -> None:
        self.out.actions += 1
        live = self.live[c.run_id]
        if kind == "delete":
            del live[c.id]
            self._remove(now + self.retention, c.tiers, c.size_bytes)
            self.out.would.append(WouldBe(c.id, c.run_id, c.step, "delete", now))
        elif kind == "move" and to is not None and c.tier is not None:
            self._remove(now, frozenset({c.tier}), c.size_bytes)
            if to not in c.tiers:
                self._add(now, frozenset({to}), c.size_bytes)
            live[c.id] = c._replace(tier=to, tiers=(c.tiers - {c.tier}) | {to})
            self.out.would.append(WouldBe(c.id, c.run_id, c.step, "move", now, to))
        elif kind == "copy" and to is not None and to not in c.tiers:
            self._add(now, frozenset({to}), c.size_bytes)
            live[c.id] = c._replace(tiers=c.tiers | {to})

    def _add(self, at: datetime, tiers: frozenset[str], size: int) -> None:
        self.out.deltas.extend(Delta(at, t, size) for t in tiers)

    def _remove(self, at: datetime, tiers: frozenset[str], size: int) -> None:
        self.out.deltas.extend(Delta(at, t, -size) for t in tiers)


def _next_midnight(moment: datetime) -> datetime:
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + timedelta(days=1)
