"""The policy engine written as plainly as the contract reads (DESIGN section 6): the oracle
the engine's fast paths are held to, reason for reason and in the same order.

No shared strings, no lazy protections, no shortcuts by class: per rule, per checkpoint,
what the rule says of it; then per checkpoint, what it comes to.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from app.domain.plan import CheckpointSnapshot, Kept, Plan, PlannedAction, RunSnapshot
from app.policy.engine import (
    _checkpoint_unmet,
    _describe,
    _proposal,
    _resolve,
    _run_unmet,
    protections,
)
from app.policy.keep import kept_by_rule
from app.policy.schema import Policy


def evaluate_plainly(
    policy: Policy,
    run: RunSnapshot,
    checkpoints: Sequence[CheckpointSnapshot],
    now: datetime,
    *,
    tier_ranks: Mapping[str, int],
    resumed_by_active: Collection[str] = (),
    explain: bool = True,
) -> Plan:
    live = [c for c in checkpoints if c.state == "active" and c.run_id == run.id]
    protected = protections(run, live, now, resumed_by_active)
    proposals: dict[str, list[tuple[str, str | None, str, str]]] = {}
    reasons: dict[str, list[str]] = {}
    for rule in sorted(policy.rules, key=lambda r: r.name):
        members = [c for c in live if rule.classes is None or c.klass in rule.classes]
        if rule.classes is not None:  # grouped by class, the classes in name order
            members.sort(key=lambda c: sorted(rule.classes or ()).index(c.klass))
        if not members:
            continue
        kept = kept_by_rule(rule, members, now)
        run_unmet = _run_unmet(rule, run, now)
        for c in members:
            if c.id in kept:
                reasons.setdefault(c.id, []).append(f"{rule.name}: {kept[c.id]}")
            elif run_unmet is not None:
                reasons.setdefault(c.id, []).append(f"{rule.name}: waiting, {run_unmet}")
            elif (unmet := _checkpoint_unmet(rule, c, now)) is not None:
                reasons.setdefault(c.id, []).append(f"{rule.name}: waiting, {unmet}")
            else:
                proposal = _proposal(rule, c, tier_ranks)
                if isinstance(proposal, str):
                    reasons.setdefault(c.id, []).append(f"{rule.name}: {proposal}")
                elif proposal[0] == "copy" or c.id not in protected:
                    kind, target = proposal
                    why = _describe(rule, kind, target)
                    proposals.setdefault(c.id, []).append((kind, target, rule.name, why))
    actions: list[PlannedAction] = []
    kept_list: list[Kept] = []
    ordered = sorted(live, key=lambda c: c.step, reverse=True) if explain else live
    for c in ordered:
        chosen = _resolve(proposals.get(c.id, []), tier_ranks)
        for kind, target, rule_name, why in chosen:
            named = f"{policy.name}/{rule_name}"
            actions.append(
                PlannedAction(c.id, run.id, c.step, kind, c.tier, target, named, why, c.size_bytes)
            )
        if not explain:
            continue
        protected_by = [protected[c.id]] if c.id in protected else []
        if not chosen:
            given = reasons.get(c.id) or ([] if protected_by else ["no rule applies"])
            kept_list.append(Kept(c.id, c.step, (*protected_by, *given)))
        elif not any(kind == "delete" for kind, *_ in chosen):
            whys = [why for *_, why in chosen]
            kept_list.append(Kept(c.id, c.step, (*protected_by, *whys, *reasons.get(c.id, []))))
    return Plan(actions=tuple(actions), kept=tuple(kept_list))


def keep_best_plainly(
    checkpoints: Sequence[CheckpointSnapshot], metric: str, mode: str, count: int
) -> dict[str, str]:
    """`keep_best` as the contract reads: the `count` best by the metric (ties: the higher
    step), and every checkpoint without the metric, kept."""
    label = f"keep_best {count} by {mode} {metric}"
    kept = {c.id: f"{label} (metric missing)" for c in checkpoints if metric not in c.metrics}
    scored = [c for c in checkpoints if metric in c.metrics]
    sign = 1 if mode == "min" else -1
    scored.sort(key=lambda c: (sign * c.metrics[metric], -c.step))
    best = scored if count == -1 else scored[:count]
    return {**kept, **{c.id: label for c in best}}
