"""What the action ledger tells a plan: the work already open (reported, not planned
again) and the work that failed (planned again only after a back-off)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Action
from app.domain.plan import PlannedAction, Skipped
from app.domain.states import OPEN_STATES, ActionState

# Work whose action failed (its attempts spent, say while a provider is down) is planned
# again only after a pause that doubles with each failure: a long outage then leaves a few
# failed actions per checkpoint, not one per sweep.
REPLAN_AFTER_FAILURE = timedelta(minutes=15)
REPLAN_AFTER_FAILURE_MAX = timedelta(hours=24)

# (checkpoint id, kind, target tier): what the ledger knows of one piece of work
WorkKey = tuple[str, str, str | None]


@dataclass(frozen=True, slots=True)
class OpenAction:
    """An action in the ledger not yet ended: a plan reports it rather than make another."""

    id: str
    state: str


def read_ledger(
    session: Session, run_id: str | None
) -> tuple[dict[WorkKey, OpenAction], dict[WorkKey, tuple[int, datetime]]]:
    """The open actions, and per piece of work how many rule-planned actions failed and
    when the last one did. One run's come in one statement (its ledger is short, and a
    registration's evaluation pays per round trip); a wider scope's failures are counted
    by the database."""
    wanted = (*OPEN_STATES, ActionState.FAILED)
    columns = (Action.checkpoint_id, Action.kind, Action.to_tier, Action.id, Action.state)
    if run_id is not None:
        rows = session.execute(
            select(*columns, Action.rule, Action.finished_at).where(
                Action.run_id == run_id, Action.state.in_(wanted)
            )
        )
        existing: dict[WorkKey, OpenAction] = {}
        failed: dict[WorkKey, list[datetime | None]] = defaultdict(list)
        for checkpoint_id, kind, to_tier, action_id, state, rule, finished in rows:
            key = (checkpoint_id, kind, to_tier)
            if state != ActionState.FAILED:
                existing[key] = OpenAction(action_id, state)
            elif rule != "manual":
                failed[key].append(finished)
        failures = {}
        for key, ends in failed.items():  # as the database counts them below
            last = max((t for t in ends if t is not None), default=None)
            if last is not None:
                failures[key] = (len(ends), last)
        return existing, failures
    opened = session.execute(select(*columns).where(Action.state.in_(OPEN_STATES)))
    existing = {(c, k, t): OpenAction(i, st) for c, k, t, i, st in opened}
    return existing, _failures(session)


def _failures(session: Session) -> dict[WorkKey, tuple[int, datetime]]:
    stmt = (
        select(
            Action.checkpoint_id,
            Action.kind,
            Action.to_tier,
            func.count(),
            func.max(Action.finished_at),
        )
        .where(Action.state == ActionState.FAILED, Action.rule != "manual")
        .group_by(Action.checkpoint_id, Action.kind, Action.to_tier)
    )
    return {
        (checkpoint_id, kind, to_tier): (int(count), last)
        for checkpoint_id, kind, to_tier, count, last in session.execute(stmt)
        if last is not None
    }


def replan_after(failures: int) -> timedelta:
    """How long after its last failure the same work is planned again."""
    return min(REPLAN_AFTER_FAILURE * (1 << min(failures - 1, 16)), REPLAN_AFTER_FAILURE_MAX)


def not_yet_again(
    actions: list[PlannedAction],
    failures: dict[WorkKey, tuple[int, datetime]],
    now: datetime,
) -> tuple[list[PlannedAction], list[Skipped]]:
    """The actions to plan now, and those that failed too recently to try again."""
    keep: list[PlannedAction] = []
    wait: list[Skipped] = []
    for a in actions:
        failed = failures.get((a.checkpoint_id, a.kind, a.to_tier))
        if failed is None or failed[1] + replan_after(failed[0]) <= now:
            keep.append(a)
            continue
        count, last = failed
        again = last + replan_after(count)
        wait.append(
            Skipped(
                a.checkpoint_id,
                a.rule,
                f"{a.kind} failed {count} time{'s' if count > 1 else ''} (last at "
                f"{last:%Y-%m-%dT%H:%M:%SZ}): planned again after {again:%Y-%m-%dT%H:%M:%SZ}",
            )
        )
    return keep, wait


def planned_again_at(
    failures: dict[WorkKey, tuple[int, datetime]],
    locks: dict[str, tuple[datetime, str]],
) -> dict[str, list[datetime]]:
    """Per checkpoint, the instants its failed work is planned again and its lock ends."""
    found: dict[str, list[datetime]] = defaultdict(list)
    for (checkpoint_id, _kind, _to), (count, last) in failures.items():
        found[checkpoint_id].append(last + replan_after(count))
    for checkpoint_id, (until, _why) in locks.items():
        found[checkpoint_id].append(until)
    return found
