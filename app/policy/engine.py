"""The policy engine: a pure function from a run's snapshot to a plan.

No I/O, no clock, no ORM: everything it needs is passed in, so a dry run, a sweep, a
registration-triggered evaluation and a forecast all get the same answer.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter

from app.domain.duration import format_duration, format_instant
from app.domain.plan import CheckpointSnapshot, Kept, Plan, PlannedAction, RunSnapshot
from app.policy.keep import kept_by_rule
from app.policy.schema import CopyTo, MoveTo, Policy, Rule

GRACE = timedelta(seconds=60)
_NO_RULE = ("no rule applies",)


def select_policy(policies: Iterable[Policy], run: RunSnapshot) -> Policy | None:
    """The one policy governing `run`: its explicit policy (none if that name is unknown:
    a missing policy must never widen to another), else the matching policy with the
    highest priority (ties: the name that sorts first), else `default`, else none. Shadow
    policies govern no run: they are not candidates, and a run naming one is governed by
    none."""
    return _select(policies, run, None)


def would_govern(candidate: Policy, policies: Iterable[Policy], run: RunSnapshot) -> bool:
    """Whether `candidate` would govern `run` were it enforced, beside the enforced
    `policies` (other shadow policies ignored, as every shadow policy is)."""
    return _select(policies, run, candidate) is candidate


def shadows_of(policies: Sequence[Policy], run: RunSnapshot) -> list[Policy]:
    """The shadow policies among `policies` that would govern `run` under the usual rules,
    each weighed against the enforced policies alone: S shadows the run when selecting
    among the enforced policies and S (taken as enforced) chooses S."""
    return [p for p in policies if not p.enforced and would_govern(p, policies, run)]


def _select(policies: Iterable[Policy], run: RunSnapshot, extra: Policy | None) -> Policy | None:
    by_name = {p.name: p for p in policies if p.mode == "enforce"}
    if extra is not None:
        by_name[extra.name] = extra
    if run.policy is not None:
        return by_name.get(run.policy)
    matching = [p for p in by_name.values() if applies(p, run)]
    if matching:
        return min(matching, key=lambda p: (-p.priority, p.name))
    return by_name.get("default")


def applies(policy: Policy, run: RunSnapshot) -> bool:
    """Whether `applies_to` selects the run: a project glob matches, and every label."""
    scope = policy.applies_to
    if not any(fnmatch.fnmatchcase(run.project, pattern) for pattern in scope.projects):
        return False
    return all(run.labels.get(k) == v for k, v in scope.labels.items())


def _run_unmet(rule: Rule, run: RunSnapshot, now: datetime) -> str | None:
    """The first run-level `when` condition that does not hold, described; None when all do.
    Checked once per rule, not once per checkpoint."""
    when = rule.when
    if when.run_ended is not None:
        ended = run.status != "active" and run.ended_at is not None
        if not ended or now - run.ended_at < when.run_ended:  # type: ignore[operator]
            return f"run_ended {format_duration(when.run_ended)} not reached"
    if when.run_status is not None and run.status not in when.run_status:
        return f"run_status is {run.status}"
    return None


def _checkpoint_unmet(rule: Rule, c: CheckpointSnapshot, now: datetime) -> str | None:
    when = rule.when
    if when.age is not None and now - c.created_at < when.age:
        return f"age {format_duration(when.age)} not reached"
    if when.on_tier is not None and c.tier not in when.on_tier:
        return f"not on {', '.join(when.on_tier)}"
    return None


def protections(
    run: RunSnapshot,
    live: Sequence[CheckpointSnapshot],
    now: datetime,
    resumed_by_active: Collection[str],
) -> dict[str, str]:
    """Checkpoints that no rule may delete or move, with why."""
    found: dict[str, str] = {}
    if run.status == "active" and live:
        resume_point = max(live, key=lambda c: c.step)
        found[resume_point.id] = "protected: resume point of the active run"
    for c in live:
        if c.id in resumed_by_active or (run.status == "active" and c.id == run.resumed_from):
            found[c.id] = "protected: an active run resumed from it"
        if c.protected_until is not None and now < c.protected_until:
            found[c.id] = f"protected: undeleted until {format_instant(c.protected_until)}"
        if c.pinned:
            found[c.id] = "protected: pinned"
        if now - c.created_at < GRACE:
            found.setdefault(c.id, "protected: created less than 60s ago")
    return found


def _proposal(
    rule: Rule, c: CheckpointSnapshot, ranks: Mapping[str, int]
) -> tuple[str, str | None] | str:
    """(kind, to_tier) this rule asks for `c`, or why it would change nothing."""
    action = rule.action
    if isinstance(action, MoveTo):
        target = action.move_to
        if c.tier is None:
            return "no primary location"
        if c.tier == target:
            return f"already on {target}"
        if ranks.get(target, -1) <= ranks.get(c.tier, -1):
            return f"already on {c.tier}, colder than {target}"  # policies only demote
        return ("move", target)
    if isinstance(action, CopyTo):
        if action.copy_to in c.tiers:
            return f"already on {action.copy_to}"
        return ("copy", action.copy_to)
    return ("delete", None)


def evaluate(
    policy: Policy,
    run: RunSnapshot,
    checkpoints: Sequence[CheckpointSnapshot],
    now: datetime,
    *,
    tier_ranks: Mapping[str, int],
    resumed_by_active: Collection[str] = (),
    explain: bool = True,
    live_only: bool = False,
) -> Plan:
    """Plan what `policy` does to one run's checkpoints at `now`.

    Only `active` checkpoints count. Keep clauses of a rule are a union over the run's
    live checkpoints of the rule's class. Protections (pin, resume point, a checkpoint an
    active run resumed from, 60 s grace) stop deletes and moves, not copies. Per checkpoint
    delete beats move beats copy, the coldest move wins; rule order does not matter.
    With `explain=False` the plan carries actions only (what a sweep needs), not the
    reasons each kept checkpoint stays. `live_only` promises `checkpoints` are the run's
    active ones and nothing else.
    """
    # `live_only`: the caller passes the run's active checkpoints alone (a million-row plan
    # skips filtering them again)
    live = (
        list(checkpoints)
        if live_only
        else [c for c in checkpoints if c.state == "active" and c.run_id == run.id]
    )
    # Worked out when first needed by a sweep: most runs of a large catalog have nothing to
    # do, and asking costs a pass over every checkpoint. An explained plan says of every
    # kept checkpoint whether it is protected: it asks once, up front.
    protected_found: list[dict[str, str]] = []
    if explain:
        protected_found.append(protections(run, live, now, resumed_by_active) if live else {})

    def is_protected(checkpoint_id: str) -> bool:
        if not protected_found:
            protected_found.append(protections(run, live, now, resumed_by_active))
        return checkpoint_id in protected_found[0]

    by_class: dict[str, list[CheckpointSnapshot]] = {}
    for c in live:
        by_class.setdefault(c.klass, []).append(c)
    proposals: dict[str, list[tuple[str, str | None, str, str]]] = {}
    reasons: dict[str, list[str]] = {}
    described: dict[tuple[str, str, str | None], str] = {}
    for rule in sorted(policy.rules, key=_name):
        classes = rule.classes
        if classes is not None and not any(k in by_class for k in classes):
            continue
        run_unmet = _run_unmet(rule, run, now)
        if run_unmet is not None and not explain:
            continue  # a sweep's plan of a rule waiting for its run: nothing to gather
        if classes is None:
            members = live
        else:
            members = [c for k in sorted(classes) for c in by_class.get(k, ())]
        if not members:
            continue
        kept = kept_by_rule(rule, members, now)
        # "<rule>: <why>" once per distinct why: a million checkpoints share a handful of
        # reasons, as one string each (a keep clause's, an unmet condition's, a no-op's)
        said = _Said(f"{rule.name}: ")
        if run_unmet is not None:  # explained: every member is kept, or waits for the run
            _say_to_all(reasons, members, kept, said, f"{rule.name}: waiting, {run_unmet}")
            continue
        waits = _Said(f"{rule.name}: waiting, ")
        for c in members:
            kept_as = kept.get(c.id)
            if kept_as is not None:
                if explain:
                    reasons.setdefault(c.id, []).append(said(kept_as))
                continue
            unmet = _checkpoint_unmet(rule, c, now)
            if unmet is not None:
                if explain:
                    reasons.setdefault(c.id, []).append(waits(unmet))
                continue
            proposal = _proposal(rule, c, tier_ranks)
            if isinstance(proposal, str):
                if explain:
                    reasons.setdefault(c.id, []).append(said(proposal))
                continue
            kind, target = proposal
            if kind != "copy" and is_protected(c.id):
                continue
            why = described.get((rule.name, kind, target))
            if why is None:
                why = described[rule.name, kind, target] = _describe(rule, kind, target)
            proposals.setdefault(c.id, []).append((kind, target, rule.name, why))
    qualified = {r.name: f"{policy.name}/{r.name}" for r in policy.rules}
    if not explain:
        actions = [
            action
            for c in live
            if c.id in proposals
            for action in _actions_of(c, run.id, _resolve(proposals[c.id], tier_ranks), qualified)
        ]
        return Plan(actions=tuple(actions))
    actions, kept_list = _explained(
        live, run.id, proposals, reasons, protected_found[0], tier_ranks, qualified
    )
    return Plan(actions=tuple(actions), kept=tuple(kept_list))


def _name(rule: Rule) -> str:
    return rule.name


_STEP = itemgetter(2)  # CheckpointSnapshot.step, read in C: a plan sorts a million of them
# not the named tuples' own constructors: a plan of a million checkpoints makes a million
# kept entries and 200,000 actions
_new = tuple.__new__


def _say_to_all(
    reasons: dict[str, list[str]],
    members: Sequence[CheckpointSnapshot],
    kept: Mapping[str, str],
    said: _Said,
    waiting: str,
) -> None:
    """A rule waiting for its run (`run_ended`, `run_status`) proposes nothing: each member
    is kept by a clause, or waits, with the same words as every other member that does."""
    for c in members:
        cid = c.id
        kept_as = kept.get(cid) if kept else None
        why = waiting if kept_as is None else said(kept_as)
        given = reasons.get(cid)
        if given is None:
            reasons[cid] = [why]
        else:
            given.append(why)


def _actions_of(
    c: CheckpointSnapshot,
    run_id: str,
    chosen: list[tuple[str, str | None, str, str]],
    qualified: Mapping[str, str],
) -> list[PlannedAction]:
    # PlannedAction's fields in order: checkpoint_id, run_id, step, kind, from_tier,
    # to_tier, rule, reason, bytes
    return [
        _new(
            PlannedAction,
            (c.id, run_id, c.step, kind, c.tier, target, qualified[name], why, c.size_bytes),
        )
        for kind, target, name, why in chosen
    ]


def _explained(
    live: Sequence[CheckpointSnapshot],
    run_id: str,
    proposals: Mapping[str, list[tuple[str, str | None, str, str]]],
    reasons: Mapping[str, list[str]],
    protected: Mapping[str, str],
    tier_ranks: Mapping[str, int],
    qualified: Mapping[str, str],
) -> tuple[list[PlannedAction], list[Kept]]:
    """Actions and kept checkpoints, newest step first, each kept one with every reason
    it stays: its protection, then what the rules said of it in rule order."""
    actions: list[PlannedAction] = []
    kept_list: list[Kept] = []
    alike: dict[tuple[str, ...], tuple[str, ...]] = {}
    for c in sorted(live, key=_STEP, reverse=True):
        cid = c.id
        proposed = proposals.get(cid)
        if proposed is None:  # the usual case: kept, and why is all the rules said
            protected_by = protected.get(cid)
            given = reasons.get(cid)
            if protected_by is not None:
                because = (protected_by, *given) if given else (protected_by,)
            else:
                because = tuple(given) if given else _NO_RULE
            # most of a run's kept checkpoints stay for the same reasons: one tuple each
            because = alike.setdefault(because, because)
            kept_list.append(_new(Kept, (cid, c.step, because)))
            continue
        chosen = _resolve(proposed, tier_ranks)
        actions += _actions_of(c, run_id, chosen, qualified)
        if not any(kind == "delete" for kind, *_ in chosen):
            protected_by = protected.get(cid)
            why_kept = [protected_by] if protected_by is not None else []
            why_kept += [why for *_, why in chosen] + reasons.get(cid, [])
            kept_list.append(Kept(cid, c.step, tuple(why_kept)))
    return actions, kept_list


class _Said(dict[str, str]):
    """`prefix + why`, made once per distinct `why` and shared by every checkpoint it is
    said of."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def __call__(self, why: str) -> str:
        return self.get(why) or self.setdefault(why, self.prefix + why)


def _describe(rule: Rule, kind: str, target: str | None) -> str:
    keeps = rule.describe_keeps()
    verb = {"delete": "delete", "move": f"move to {target}", "copy": f"copy to {target}"}[kind]
    beyond = f", not kept by {' or '.join(keeps)}" if keeps else ""
    return f"{rule.name}: {verb}{beyond}"


def _resolve(
    proposals: list[tuple[str, str | None, str, str]], ranks: Mapping[str, int]
) -> list[tuple[str, str | None, str, str]]:
    """Delete beats move beats copy; the coldest move wins; distinct copies all stand.
    Proposals arrive in rule-name order, so ties go to the name that sorts first and the
    order of rules in a file never matters."""
    if len(proposals) < 2:
        return proposals
    for p in proposals:
        if p[0] == "delete":
            return [p]
    moves = [p for p in proposals if p[0] == "move"]
    if moves:
        return [max(moves, key=lambda p: ranks.get(p[1] or "", -1))]  # first of the coldest
    by_target: dict[str | None, tuple[str, str | None, str, str]] = {}
    for p in proposals:
        by_target.setdefault(p[1], p)
    return [by_target[t] for t in sorted(by_target, key=lambda t: ranks.get(t or "", -1))]
