"""What moving and deleting costs, and the demotions not worth making (section 7b).

A demotion to a tier with a minimum storage duration of M days is skipped when the same
policy would remove the checkpoint from that tier on time alone L < M days after the move,
and the charge for the unserved M - L days at the new tier's price exceeds the saving of L
days at the lower price. "On time alone": by a rule whose `age`, `run_ended` or
`keep_within` comes due, with the run and its other checkpoints as they are; never by a
rule that applies only because the checkpoint is on the new tier (skipping the move would
then keep it where it is for good).

Pure: the policy engine's own `evaluate`, replayed at the moments those rules come due.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from app.cost.prices import GB, MONTH_DAYS, PriceQuote
from app.domain.plan import (
    CheckpointSnapshot,
    Kept,
    Plan,
    PlannedAction,
    RunSnapshot,
    Skipped,
)
from app.policy.engine import evaluate
from app.policy.schema import CopyTo, MoveTo, Policy, Rule

DAY_SECONDS = 86_400


class ActionCost(NamedTuple):
    """One-off charges of one action, in USD (never rounded). A tuple: an explained plan
    of a million checkpoints prices 200,000 actions."""

    retrieval_usd: float = 0.0
    egress_usd: float = 0.0
    early_deletion_usd: float = 0.0
    requests_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.retrieval_usd + self.egress_usd + self.early_deletion_usd + self.requests_usd


def early_deletion_usd(
    size_bytes: float, days_on_tier: float, quote: PriceQuote, objects: int = 1
) -> float:
    """The charge for leaving a tier before its minimum storage duration is served: the
    unserved days at the tier's storage price (0 once served)."""
    unserved = max(0.0, quote.min_storage_days - days_on_tier)
    return (
        quote.billable_bytes(size_bytes, objects)
        / GB
        * quote.storage_gb_month
        * unserved
        / MONTH_DAYS
    )


def action_cost(
    kind: str,
    size_bytes: float,
    *,
    source: PriceQuote | None,
    target: PriceQuote | None = None,
    days_on_source: float = math.inf,
    objects: int = 1,
) -> ActionCost:
    """Charges of an action on a checkpoint of `size_bytes` in `objects` objects.

    Reading the source (`move`, `copy`, `restore`) pays its retrieval fee, plus its egress
    when the target is on another provider's network, plus a read and a write request per
    object. Removing the source (`move`, and `delete` or `purge` per location) before its
    minimum storage duration pays the unserved days. Deletes are free requests everywhere.
    """
    if source is None:
        return ActionCost()
    removes = kind in ("move", "delete", "purge")
    early = early_deletion_usd(size_bytes, days_on_source, source, objects) if removes else 0.0
    if kind in ("delete", "purge"):
        return ActionCost(early_deletion_usd=early)
    gigabytes = size_bytes / GB
    retrieval = gigabytes * source.retrieval_gb
    crosses = target is not None and target.network != source.network
    egress = gigabytes * source.egress_gb if crosses else 0.0
    writes = target.write_requests_per_1000 if target is not None else 0.0
    requests = objects * (source.read_requests_per_1000 + writes) / 1000
    return ActionCost(
        retrieval_usd=retrieval,
        egress_usd=egress,
        early_deletion_usd=early,
        requests_usd=requests,
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """A demotion weighed: the penalty of leaving early against what L days save."""

    days_on_target: float  # L
    penalty_usd: float
    saving_usd: float

    @property
    def skip(self) -> bool:
        return self.penalty_usd > self.saving_usd


def weigh_demotion(
    size_bytes: float, *, source: PriceQuote, target: PriceQuote, days_on_target: float
) -> Verdict:
    """Section 7b's comparison for a demotion that will leave `target` after L days:
    penalty = (M - L) days at the target's price, saving = L days at the price difference.
    (Equivalently: skip when M x target price > L x source price.)"""
    gigabytes = size_bytes / GB
    unserved = max(0.0, target.min_storage_days - days_on_target)
    penalty = gigabytes * target.storage_gb_month * unserved / MONTH_DAYS
    saving = (
        gigabytes * (source.storage_gb_month - target.storage_gb_month) * days_on_target
    ) / MONTH_DAYS
    return Verdict(days_on_target, penalty, saving)


def _after(plan: Plan, checkpoints: Sequence[CheckpointSnapshot]) -> list[CheckpointSnapshot]:
    """The run's checkpoints once every action of `plan` is done."""
    by_id = {c.id: c for c in checkpoints}
    for a in plan.actions:
        c = by_id.get(a.checkpoint_id)
        if c is None:
            continue
        if a.kind == "delete":
            del by_id[c.id]
        elif a.kind == "move" and a.to_tier is not None:
            held = (c.tiers | {c.tier} if c.tier else c.tiers) - {a.from_tier}
            by_id[c.id] = c._replace(tier=a.to_tier, tiers=frozenset(held | {a.to_tier}))
        elif a.kind == "copy" and a.to_tier is not None:
            by_id[c.id] = c._replace(tiers=c.tiers | {a.to_tier})
    return list(by_id.values())


def _due(rule: Rule, c: CheckpointSnapshot, run: RunSnapshot, now: datetime) -> datetime | None:
    """When a rule's time conditions on `c` all hold (and keep_within lets go of it), with
    the run as it is; None when they never will (a run_ended rule on a running run)."""
    when = rule.when
    if when.run_status is not None and run.status not in when.run_status:
        return None
    due = now
    if when.run_ended is not None:
        if run.status == "active" or run.ended_at is None:
            return None
        due = max(due, run.ended_at + when.run_ended)
    if when.age is not None:
        due = max(due, c.created_at + when.age)
    if rule.keep_within is not None:
        due = max(due, c.created_at + rule.keep_within)
    return due


def _removers(
    policy: Policy, c: CheckpointSnapshot, source: str, target: str, ranks: Mapping[str, int]
) -> tuple[Rule, ...]:
    """Rules that could take `c` off `target` on time alone: a delete, or a move colder than
    `target`, of its class, not limited to tiers that exclude `source` or `target`."""
    found = []
    for rule in policy.rules:
        if rule.classes is not None and c.klass not in rule.classes:
            continue
        action = rule.action
        if isinstance(action, CopyTo):
            continue
        if isinstance(action, MoveTo) and ranks.get(action.move_to, -1) <= ranks.get(target, -1):
            continue
        on = rule.when.on_tier
        if on is not None and (target not in on or source not in on):
            continue
        found.append(rule)
    return tuple(found)


def skip_costly_demotions(
    plan: Plan,
    policy: Policy,
    run: RunSnapshot,
    checkpoints: Sequence[CheckpointSnapshot],
    now: datetime,
    *,
    tier_ranks: Mapping[str, int],
    prices: Mapping[str, PriceQuote],
    resumed_by_active: Collection[str] = (),
) -> Plan:
    """`plan` (the engine's for this run at `now`) without the demotions whose early-deletion
    penalty exceeds their saving; each one dropped is listed in `skipped` with the figures.

    Costs nothing when no planned move targets a tier with a minimum storage duration.
    Otherwise the engine is replayed, on the run as the plan leaves it, at each moment a
    rule that could remove the checkpoint comes due within that minimum.
    """
    if not plan.actions:
        return plan
    minimum = {name for name, quote in prices.items() if quote.min_storage_days > 0}
    demotions = [
        (a, a.from_tier, a.to_tier)
        for a in plan.actions
        if a.kind == "move" and a.to_tier in minimum and a.from_tier in prices
    ]
    if not demotions:
        return plan
    after = _after(plan, checkpoints)
    by_id = {c.id: c for c in after}
    replays: dict[tuple[tuple[str, ...], datetime], dict[str, str]] = {}
    skipped: list[Skipped] = []
    for a, from_tier, to_tier in demotions:
        c = by_id.get(a.checkpoint_id)
        if c is None or from_tier is None or to_tier is None:
            continue
        source, target = prices[from_tier], prices[to_tier]
        limit = now + timedelta(days=target.min_storage_days)
        rules = _removers(policy, c, from_tier, to_tier, tier_ranks)
        moments = sorted(
            {due for r in rules if (due := _due(r, c, run, now)) is not None and due < limit}
        )
        names = tuple(r.name for r in rules)
        for moment in moments:
            key = (names, moment)
            removed = replays.get(key)
            if removed is None:
                sub = policy.model_copy(update={"rules": list(rules)})
                result = evaluate(
                    sub,
                    run,
                    after,
                    moment,
                    tier_ranks=tier_ranks,
                    resumed_by_active=resumed_by_active,
                    explain=False,
                )
                removed = replays[key] = {
                    x.checkpoint_id: x.rule for x in result.actions if x.kind != "copy"
                }
            if c.id not in removed:
                continue
            days = (moment - now).total_seconds() / DAY_SECONDS
            verdict = weigh_demotion(
                c.size_bytes, source=source, target=target, days_on_target=days
            )
            if verdict.skip:
                skipped.append(Skipped(c.id, a.rule, _reason(a, removed[c.id], verdict, target)))
            break
    if not skipped:
        return plan
    dropped = {s.checkpoint_id: s.reason for s in skipped}
    actions = tuple(
        x for x in plan.actions if not (x.kind == "move" and x.checkpoint_id in dropped)
    )
    kept = tuple(
        Kept(k.checkpoint_id, k.step, (*k.reasons, dropped[k.checkpoint_id]))
        if k.checkpoint_id in dropped
        else k
        for k in plan.kept
    )
    return Plan(actions=actions, kept=kept, skipped=(*plan.skipped, *skipped))


def _reason(a: PlannedAction, remover: str, verdict: Verdict, target: PriceQuote) -> str:
    rule = remover.split("/", 1)[-1]
    unserved = target.min_storage_days - verdict.days_on_target
    return (
        f"early deletion: {rule} would remove it from {a.to_tier} "
        f"{_days(verdict.days_on_target)} after the move, before its "
        f"{target.min_storage_days}-day minimum; the unserved {_days(unserved)} cost "
        f"{_usd(verdict.penalty_usd)}, more than the {_usd(verdict.saving_usd)} the move saves"
    )


def describe_charges(cost: ActionCost) -> str | None:
    """`about $X (retrieval $a, egress $b, requests $c)`, the parts that are not zero; None
    when the action is free at the tiers' prices."""
    parts = [
        (name, amount)
        for name, amount in (
            ("retrieval", cost.retrieval_usd),
            ("egress", cost.egress_usd),
            ("early deletion", cost.early_deletion_usd),
            ("requests", cost.requests_usd),
        )
        if amount > 0
    ]
    if not parts:
        return None
    detail = ", ".join(f"{name} {_usd(amount)}" for name, amount in parts)
    return f"about {_usd(cost.total_usd)} ({detail})"


def _usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount == 0 or abs(amount) >= 0.01 else f"${amount:.2g}"


def _days(days: float) -> str:
    return f"{round(days, 1):g} days"
