"""Keep clauses: which of a run's live checkpoints of one class a rule exempts, and why.

Each function returns {checkpoint id: reason}. Clauses combine as a union.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import TypeVar

from app.domain.duration import format_duration
from app.domain.plan import CheckpointSnapshot
from app.policy.schema import CALENDAR_CLAUSES, Rule

Bucket = Callable[[datetime], int]
_T = TypeVar("_T")
_STEP = itemgetter(2)  # CheckpointSnapshot.step, read in C

BUCKETS: dict[str, Bucket] = {
    "keep_hourly": lambda t: t.year * 1_000_000 + t.month * 10_000 + t.day * 100 + t.hour,
    "keep_daily": lambda t: t.year * 10_000 + t.month * 100 + t.day,
    "keep_weekly": lambda t: t.isocalendar().year * 100 + t.isocalendar().week,
    "keep_monthly": lambda t: t.year * 100 + t.month,
    "keep_yearly": lambda t: t.year,
}


def _utc(t: datetime) -> datetime:
    """Periods are UTC hours, days, ISO weeks, months and years; naive times are taken as UTC."""
    return t if t.tzinfo is None else t.astimezone(UTC)


def _limit(items: Sequence[_T], count: int) -> Sequence[_T]:
    return items if count == -1 else items[:count]


def keep_last(checkpoints: Sequence[CheckpointSnapshot], count: int) -> dict[str, str]:
    newest = sorted(checkpoints, key=_STEP, reverse=True)
    label = f"keep_last {count}"
    return {c.id: label for c in _limit(newest, count)}


def keep_best(
    checkpoints: Sequence[CheckpointSnapshot], metric: str, mode: str, count: int
) -> dict[str, str]:
    label = f"keep_best {count} by {mode} {metric}"
    missing = f"{label} (metric missing)"
    kept: dict[str, str] = {}
    sign = 1 if mode == "min" else -1
    # best first, the higher step first among equals, then the order given: decorated
    # tuples sorted in C rather than a key function called per checkpoint (a plan ranks
    # every run's milestones)
    ranked: list[tuple[float, int, int, str]] = []
    for position, c in enumerate(checkpoints):
        found = c.metrics
        if metric in found:
            ranked.append((sign * found[metric], -c.step, position, c.id))
        else:
            kept[c.id] = missing
    ranked.sort()
    kept.update((cid, label) for *_, cid in _limit(ranked, count))
    return kept


def keep_every(checkpoints: Sequence[CheckpointSnapshot], steps: int) -> dict[str, str]:
    label = f"keep_every {steps} steps"
    return {c.id: label for c in checkpoints if c.step % steps == 0}


def keep_within(
    checkpoints: Sequence[CheckpointSnapshot], within: timedelta, now: datetime
) -> dict[str, str]:
    label = f"keep_within {format_duration(within)}"
    return {c.id: label for c in checkpoints if now - c.created_at < within}


def keep_calendar(checkpoints: Sequence[CheckpointSnapshot], rule: Rule) -> dict[str, str]:
    """restic `forget` semantics: newest to oldest by created_at (ties: higher step first);
    each clause keeps a checkpoint whose period differs from that of the last one it kept,
    until its count is spent; the oldest checkpoint is kept while a clause has count left."""
    clauses = [(name, getattr(rule, name)) for name in CALENDAR_CLAUSES]
    counts = {name: count for name, count in clauses if count is not None and count != 0}
    if not counts:
        return {}
    ordered = sorted(checkpoints, key=lambda c: (c.created_at, c.step), reverse=True)
    last: dict[str, int | None] = dict.fromkeys(counts)
    kept: dict[str, list[str]] = {}
    for index, checkpoint in enumerate(ordered):
        oldest = index == len(ordered) - 1
        for name in counts:
            if counts[name] == 0:
                continue
            period = BUCKETS[name](_utc(checkpoint.created_at))
            if period != last[name] or oldest:
                last[name] = period
                if counts[name] > 0:
                    counts[name] -= 1
                kept.setdefault(checkpoint.id, []).append(f"{name} {getattr(rule, name)}")
    return {cid: ", ".join(reasons) for cid, reasons in kept.items()}


def kept_by_rule(
    rule: Rule, checkpoints: Sequence[CheckpointSnapshot], now: datetime
) -> dict[str, str]:
    """Union of every keep clause of `rule` over the run's live checkpoints of its class."""
    found: list[dict[str, str]] = []
    if rule.keep_last is not None:
        found.append(keep_last(checkpoints, rule.keep_last))
    if rule.keep_best is not None:
        kb = rule.keep_best
        found.append(keep_best(checkpoints, kb.metric, kb.mode, kb.count))
    if rule.keep_every is not None:
        found.append(keep_every(checkpoints, rule.keep_every.steps))
    if rule.keep_within is not None:
        found.append(keep_within(checkpoints, rule.keep_within, now))
    found.append(keep_calendar(checkpoints, rule))
    found = [kept for kept in found if kept]
    if len(found) <= 1:  # one clause's reasons as they are (a plan asks for thousands of runs)
        return found[0] if found else {}
    reasons: dict[str, list[str]] = {}
    for kept in found:
        for cid, reason in kept.items():
            reasons.setdefault(cid, []).append(reason)
    return {cid: "; ".join(r) for cid, r in reasons.items()}
