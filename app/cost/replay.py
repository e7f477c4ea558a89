"""The policy engine replayed over one simulated run, as the service would run it: after
every registration, when the run ends and at each day boundary.

A tier whose provider keeps deleted bytes (GCS soft delete, noncurrent versions: its
`billed_after_delete`) keeps billing what a delete or a move takes off it for that long, to
the horizon when for ever; the policy's decisions do not change, only the bill."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from types import MappingProxyType

from app.cost.early_deletion import action_cost, skip_costly_demotions
from app.cost.prices import PriceQuote
from app.cost.scenarios import (
    DAY,
    MAX_WORK,
    MONTH_SECONDS,
    START,
    DayUsage,
    ForecastSpec,
    Scenario,
    Usage,
)
from app.domain.errors import Invalid
from app.domain.plan import CheckpointSnapshot, PlannedAction, RunSnapshot
from app.domain.tier import Tier
from app.policy.engine import GRACE, evaluate
from app.policy.schema import Policy, Rule


class Replay:
    """One simulated run under the policy; figures are scaled to N runs on the way out.

    Shortcuts keep the replay cheap without changing a single action. The engine only sees
    the checkpoints of classes some rule selects, plus the newest checkpoint (the resume
    point it protects): no rule acts on the others. It is not called while every rule waits
    for the run to end (or for another run status). And a day-boundary evaluation is left
    out when it would find what the last one found: nothing was done since, and no time
    condition (age, run_ended, keep_within, the 60 s grace) came due.
    """

    def __init__(
        self,
        spec: ForecastSpec,
        policy: Policy,
        tiers: Sequence[Tier],
        prices: Mapping[str, PriceQuote],
        billed_after_delete: Mapping[str, timedelta | None] | None = None,
    ) -> None:
        missing = [t.name for t in tiers if t.name not in prices]
        if missing:
            raise Invalid(f"no price for tiers {', '.join(missing)}", field="prices")
        # tier -> how long its deleted bytes stay billed (None: for ever), as given or as
        # the tier's provider settings say; tiers that forget at once are left out.
        given = billed_after_delete if billed_after_delete is not None else {}
        kept = {t.name: given.get(t.name, t.provider.billed_after_delete) for t in tiers}
        self.kept_for = {name: d for name, d in kept.items() if d != timedelta(0)}
        self.spec = spec
        self.policy = policy
        self.prices = prices
        self.ranks = {t.name: t.rank for t in tiers}
        self.hot = tiers[0].name
        self.run = RunSnapshot(id="run-1", project="forecast", name="run-1", status="active")
        self.live: dict[str, CheckpointSnapshot] = {}  # in step order
        self.watched: dict[str, CheckpointSnapshot] = {}  # those some rule selects
        self.selects_all = any(r.classes is None for r in policy.rules)
        self.selected = frozenset(k for r in policy.rules for k in r.classes or ())
        self.arrived: dict[tuple[str, str], datetime] = {}  # (checkpoint, tier) -> when
        self.stored = {t.name: 0 for t in tiers}
        self.deleted = {t.name: 0 for t in tiers}  # deleted, still billed
        self.releases: list[tuple[datetime, str, int]] = []  # a heap of (when, tier, bytes)
        self.rate = 0.0  # USD a month, one run, deleted bytes still billed included
        self.deleted_rate = 0.0  # the part of `rate` for those
        self.clock = START
        self.horizon_end = START + spec.horizon * DAY
        self.replay_end = START + max(spec.run_days, spec.horizon) * DAY
        self.storage_usd = 0.0
        self.deleted_usd = 0.0
        self.fees_usd = 0.0
        self.skipped: set[str] = set()
        self.work = 0  # checkpoints handed to the engine, summed over evaluations
        self.due: list[datetime] = []  # when time conditions come due (a heap)
        self.delays: dict[str, tuple[timedelta, ...]] = {}
        self.settled = False  # the last evaluation did nothing, and nothing changed since
        self.metrics = (
            {r.keep_best.metric: r.keep_best.mode for r in policy.rules if r.keep_best}
            if spec.metrics == "improving"
            else {}
        )

    def play(self, writes: Sequence[tuple[timedelta, str]]) -> Scenario:
        run_end = START + self.spec.run_days * DAY
        last_day = (self.replay_end - START) // DAY
        at: dict[datetime, list[str]] = {}
        for t, klass in writes:
            at.setdefault(START + t, []).append(klass)
        boundaries = {START + day * DAY for day in range(1, last_day + 1)}
        series: list[DayUsage] = []
        at_run_end: Usage | None = None
        step = 0
        for moment in sorted(at.keys() | boundaries):
            for klass in at.get(moment, ()):
                step += 1
                self._register(moment, step, klass)
            if moment == run_end:
                self._advance(moment)  # what the provider let go of by then, with no write
                at_run_end = self._usage()
                self._end_run(moment)
            if moment in boundaries:
                self._evaluate(moment, forced=False)
                day = (moment - START) // DAY
                if day <= self.spec.horizon:
                    series.append(DayUsage(day, self._usage()))
        self._advance(self.horizon_end)
        assert at_run_end is not None
        n = self.spec.concurrent_runs
        return Scenario(
            tuple(series),
            at_run_end,
            self.storage_usd * n,
            self.fees_usd * n,
            self.deleted_usd * n,
        )

    def _usage(self) -> Usage:
        n = self.spec.concurrent_runs
        by_tier = {tier: size * n for tier, size in self.stored.items()}
        deleted = {tier: size * n for tier, size in self.deleted.items()}
        return Usage(MappingProxyType(by_tier), self.rate * n, MappingProxyType(deleted))

    def _advance(self, moment: datetime) -> None:
        """Bill what is stored from the clock to `moment` (not beyond the horizon), letting
        go of deleted bytes as their provider does on the way."""
        while self.releases and self.releases[0][0] <= moment:
            when, tier, size = heapq.heappop(self.releases)
            self._bill_until(when)
            self.deleted[tier] -= size
            self._reprice()
        self._bill_until(moment)

    def _bill_until(self, moment: datetime) -> None:
        end = min(moment, self.horizon_end)
        if end > self.clock:
            months = (end - self.clock).total_seconds() / MONTH_SECONDS
            self.storage_usd += self.rate * months
            self.deleted_usd += self.deleted_rate * months
            self.clock = end

    def _store(self, tier: str, size: int) -> None:
        self.stored[tier] += size
        self._reprice()

    def _remove(self, tier: str, size: int, moment: datetime) -> None:
        """Take `size` bytes off `tier` at `moment`: its provider may bill them on."""
        self.stored[tier] -= size
        if tier in self.kept_for:
            self.deleted[tier] += size
            kept = self.kept_for[tier]
            # Let go of within the replay only: a release past its end (or for ever) never
            # comes, and a long retention does not overflow the calendar.
            if kept is not None and kept <= self.replay_end - moment:
                heapq.heappush(self.releases, (moment + kept, tier, size))
        self._reprice()

    def _reprice(self) -> None:
        self.deleted_rate = sum(self.prices[t].usd_month(b) for t, b in self.deleted.items() if b)
        stored = sum(self.prices[t].usd_month(b) for t, b in self.stored.items() if b)
        self.rate = stored + self.deleted_rate

    def _put(self, c: CheckpointSnapshot) -> None:
        self.live[c.id] = c
        if self.selects_all or c.klass in self.selected:
            self.watched[c.id] = c

    def _register(self, moment: datetime, step: int, klass: str) -> None:
        self._advance(moment)
        score = {m: float(-step if mode == "min" else step) for m, mode in self.metrics.items()}
        c = CheckpointSnapshot(
            id=f"ckpt-{step}",
            run_id=self.run.id,
            step=step,
            klass=klass,
            state="active",
            size_bytes=self.spec.checkpoint_bytes,
            created_at=moment,
            tier=self.hot,
            tiers=frozenset({self.hot}),
            metrics=MappingProxyType(score),
        )
        self._put(c)
        self.arrived[c.id, self.hot] = moment
        self._store(self.hot, c.size_bytes)
        if c.id in self.watched:
            for after in self._delays(klass):
                heapq.heappush(self.due, moment + after)
        self._evaluate(moment, forced=True)

    def _delays(self, klass: str) -> tuple[timedelta, ...]:
        """How long after its creation a checkpoint of `klass` may change what the policy
        does: the grace period, and the `age` and `keep_within` of the rules selecting it."""
        found = self.delays.get(klass)
        if found is None:
            times = {GRACE}
            for rule in self.policy.rules:
                if rule.classes is None or klass in rule.classes:
                    times.update(t for t in (rule.when.age, rule.keep_within) if t is not None)
            found = self.delays[klass] = tuple(sorted(times))
        return found

    def _end_run(self, moment: datetime) -> None:
        self.run = replace(self.run, status="completed", ended_at=moment)
        for rule in self.policy.rules:
            if rule.when.run_ended is not None:
                heapq.heappush(self.due, moment + rule.when.run_ended)
        self._evaluate(moment, forced=True)

    def _evaluate(self, moment: datetime, *, forced: bool) -> None:
        self._advance(moment)
        came_due = False
        while self.due and self.due[0] <= moment:
            heapq.heappop(self.due)
            came_due = True
        if not self.watched or (self.settled and not came_due and not forced):
            return
        if not any(self._may_act(rule, moment) for rule in self.policy.rules):
            self.settled = True  # every rule waits for the run to end, or for another status
            return
        live = list(self.watched.values())
        newest = self.live[next(reversed(self.live))]
        if newest.id not in self.watched:
            live.append(newest)  # the resume point the engine protects
        self.work += len(live)
        if self.work > MAX_WORK:
            raise Invalid(
                f"the policy keeps too many checkpoints to replay within {MAX_WORK:,} "
                "checkpoint evaluations: write fewer (longer intervals) or over fewer days",
                field="schedule",
            )
        plan = evaluate(self.policy, self.run, live, moment, tier_ranks=self.ranks, explain=False)
        plan = skip_costly_demotions(
            plan, self.policy, self.run, live, moment, tier_ranks=self.ranks, prices=self.prices
        )
        self.skipped.update(s.checkpoint_id for s in plan.skipped)
        for action in plan.actions:
            self._apply(action, moment)
        self.settled = not plan.actions

    def _may_act(self, rule: Rule, moment: datetime) -> bool:
        """Whether the run meets the rule's run-level conditions (`run_ended`, `run_status`),
        which the engine checks before looking at any checkpoint."""
        when, run = rule.when, self.run
        if when.run_status is not None and run.status not in when.run_status:
            return False
        if when.run_ended is not None:
            ended = run.ended_at
            return run.status != "active" and ended is not None and moment - ended >= when.run_ended
        return True

    def _days_on(self, checkpoint: str, tier: str, moment: datetime) -> float:
        since = self.arrived.pop((checkpoint, tier), moment)
        return (moment - since) / DAY

    def _apply(self, a: PlannedAction, moment: datetime) -> None:
        c = self.live.get(a.checkpoint_id)
        if c is None:
            return
        fees = 0.0
        if a.kind == "delete":
            for tier in sorted(c.tiers):
                days = self._days_on(c.id, tier, moment)
                cost = action_cost(
                    "delete", c.size_bytes, source=self.prices[tier], days_on_source=days
                )
                fees += cost.total_usd
                self._remove(tier, c.size_bytes, moment)
            del self.live[c.id]
            self.watched.pop(c.id, None)
        elif a.kind == "move" and c.tier is not None and a.to_tier is not None:
            days = self._days_on(c.id, c.tier, moment)
            source, target = self.prices[c.tier], self.prices[a.to_tier]
            fees += action_cost(
                "move", c.size_bytes, source=source, target=target, days_on_source=days
            ).total_usd
            self._remove(c.tier, c.size_bytes, moment)
            if a.to_tier not in c.tiers:
                self._store(a.to_tier, c.size_bytes)
                self.arrived[c.id, a.to_tier] = moment
            held = (c.tiers - {c.tier}) | {a.to_tier}
            self._put(c._replace(tier=a.to_tier, tiers=frozenset(held)))
        elif a.kind == "copy" and c.tier is not None and a.to_tier is not None:
            if a.to_tier in c.tiers:
                return
            source, target = self.prices[c.tier], self.prices[a.to_tier]
            fees += action_cost("copy", c.size_bytes, source=source, target=target).total_usd
            self._store(a.to_tier, c.size_bytes)
            self.arrived[c.id, a.to_tier] = moment
            self._put(c._replace(tiers=c.tiers | {a.to_tier}))
        if moment <= self.horizon_end:
            self.fees_usd += fees
