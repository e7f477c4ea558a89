"""A backtest over the catalog (section 17): what a candidate policy would have done to the
runs the catalog actually had, day by day, beside what actually happened, and the regrets
that price the saving: checkpoints it would have removed that people came back for."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.cost.backtest import Backtest, Outcome
from app.cost.regrets import Regret, find_regrets
from app.cost.usage_series import UsageSeries, usage_series
from app.domain.tier import Tier
from app.policy.schema import Policy
from app.services.cost.history import load_history
from app.services.cost.inputs import tier_prices
from app.services.cost.uses import load_uses

ASSUMPTIONS = (
    "the candidate governs every run in scope that its applies_to selects",
    "checkpoints appear at their created_at (a reservation at its commit) on the tier they "
    "were written to; class and metrics are taken as they are now",
    "pins, unpins, undeletes, a person's deletes and restores, run starts and ends happen "
    "when they did; the deletes, moves and copies of the policy in force are replaced by "
    "the candidate's own",
    "the policy is evaluated after every event of a run and at each day boundary; its "
    "actions complete at once; held deletes count as approved",
    "a deleted checkpoint stays billed in the trash for CKPT_TRASH_RETENTION",
    "storage at each tier's price, fees left out; a month of storage is 30 days",
)


@dataclass(frozen=True, slots=True)
class BacktestResult:
    policy: str
    since: datetime
    until: datetime
    candidate: UsageSeries
    actual: UsageSeries
    regrets: list[Regret]
    runs: int
    checkpoints: int
    actions: int
    evaluations: int

    @property
    def savings_usd(self) -> float:
        return self.actual.total_usd - self.candidate.total_usd


def backtest(
    session: Session,
    policy: Policy,
    *,
    tiers: Sequence[Tier],
    now: datetime,
    trash_retention: timedelta,
    project: str | None = None,
    run_id: str | None = None,
    projects: Collection[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> BacktestResult:
    """Replay the history of the runs in scope under `policy` from their beginning; report
    the window `since` .. `until`: from the day of the first event at the earliest (no day
    before it held anything) to now at the latest. A window with no day in it answers an
    empty series, as a list filtered to nothing answers an empty page."""
    end = min(until, now) if until is not None else now
    history = load_history(session, policy, project=project, run_id=run_id, projects=projects)
    first = (history.first or end).replace(hour=0, minute=0, second=0, microsecond=0)
    start = max(since, first) if since is not None else first
    replay = Backtest(
        policy,
        history.runs,
        history.checkpoints,
        tier_ranks={t.name: t.rank for t in tiers},
        trash_retention=trash_retention,
    )
    outcome = replay.play(history.events, end) if start < end else Outcome([], [])
    prices = tier_prices(tiers)
    names = [t.name for t in tiers]
    uses = load_uses(session, {w.checkpoint_id for w in outcome.would})
    regrets = [
        r
        for r in find_regrets(outcome.would, [u for u in uses if u.at <= end])
        if r.would_delete_at >= start
    ]
    return BacktestResult(
        policy=policy.name,
        since=start,
        until=end,
        candidate=usage_series(outcome.deltas, prices, names, start, end),
        actual=usage_series(history.actual, prices, names, start, end),
        regrets=regrets,
        runs=len(history.runs),
        checkpoints=len(history.checkpoints),
        actions=outcome.actions,
        evaluations=outcome.evaluations,
    )
