"""One part of a plan: the engine over the runs of a scope, before the blast-radius hold.

A plan is the per-run evaluation of every run in scope, then a hold per project over all
of the project's new deletes. The first half needs nothing but what was read before the
catalog (the ledger's failures, the locks, the policies) and the scope itself, so a large
plan can evaluate ranges of runs in separate processes (app.services.lifecycle.
plan_helpers) and merge their parts; the second half runs once, over the merged parts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson

from app.cost.action_pricing import ActionPricer
from app.cost.early_deletion import ActionCost, skip_costly_demotions
from app.cost.prices import effective_price
from app.cost.saving_start import saving_starts
from app.domain.plan import Kept, PlannedAction, Skipped
from app.domain.states import ActionKind
from app.domain.tier import Tier
from app.policy.due import next_change
from app.policy.engine import evaluate, select_policy, shadows_of
from app.policy.schema import Policy
from app.services.lifecycle.locks import Lock, hold_back_locked
from app.services.lifecycle.plan_ledger import WorkKey, not_yet_again, planned_again_at
from app.services.lifecycle.snapshot import Scope

_T = TypeVar("_T", bound=tuple[Any, ...])
_E = TypeVar("_E")

# Beyond this many runs of a project in scope, summing what was loaded costs more than
# asking the database for the project's totals (kept per run).
LOWER_BOUND_RUNS = 200

PIECE = 5000  # entries per encoded piece of a plan's answer

# per project in scope: its runs loaded, and the (count, bytes) of their active
# checkpoints when they are few enough to sum (at most LOWER_BOUND_RUNS runs)
Loaded = tuple[int, tuple[int, int] | None]


@dataclass
class PlanInputs:
    """What every part evaluates against, read once before the catalog (a part in another
    process gets it pickled)."""

    tiers: list[Tier]
    now: datetime
    policy: Policy | None  # a what-if policy for every run, or None: the stored ones govern
    policies: list[Policy]
    explain: bool
    due: bool
    shadowing: bool
    failures: dict[WorkKey, tuple[int, datetime]]
    locks: dict[str, Lock]
    trash_retention: timedelta | None
    # a part evaluated by a helper hands over its kept checkpoints as JSON (`kept_json`):
    # the plan is answered as JSON (app.api.plan_json) and they would only be encoded here
    kept_as_json: bool = False


@dataclass
class PlanPart:
    """The evaluation of some runs: their actions by project, not yet weighed against the
    blast radius, and everything else a plan reports of them."""

    per_project: dict[str, list[PlannedAction]] = field(default_factory=dict)
    kept: list[Kept] = field(default_factory=list)
    # more kept checkpoints, after `kept`: pieces of kept_pieces (a helper's, encoded there)
    kept_json: list[bytes] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    next_due: list[tuple[str, datetime | None, datetime | None]] = field(default_factory=list)
    costs: dict[WorkKey, ActionCost] = field(default_factory=dict)
    changes: dict[WorkKey, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    shadowed: dict[str, list[Policy]] = field(default_factory=dict)
    loaded: dict[str, Loaded] = field(default_factory=dict)

    # A helper's part crosses a pipe pickled, its tuples as columns: a named tuple pickles
    # through a Python-level __reduce__, and 400,000 kept entries took 0.6 s to pickle
    # that way against 0.1 s as three lists (measured), on the plan's critical path.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "per_project": {k: _columns(v) for k, v in self.per_project.items()},
            "kept": _columns(self.kept),
            "kept_json": self.kept_json,
            "skipped": _columns(self.skipped),
            "next_due": self.next_due,
            "costs": (list(self.costs), _columns(list(self.costs.values()))),
            "changes": self.changes,
            "shadowed": self.shadowed,
            "loaded": self.loaded,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.per_project = {k: _rows(PlannedAction, v) for k, v in state["per_project"].items()}
        self.kept = _rows(Kept, state["kept"])
        self.kept_json = state["kept_json"]
        self.skipped = _rows(Skipped, state["skipped"])
        self.next_due = state["next_due"]
        keys, costs = state["costs"]
        self.costs = dict(zip(keys, _rows(ActionCost, costs), strict=True))
        self.changes = state["changes"]
        self.shadowed = state["shadowed"]
        self.loaded = state["loaded"]


def json_pieces(entries: Sequence[_E], entry: Callable[[_E], dict[str, Any]]) -> Iterator[bytes]:
    """`entries` as a plan's answer lists them (each as `entry` makes it), PIECE at a time:
    each piece the elements of a JSON array, without its brackets."""
    for start in range(0, len(entries), PIECE):
        yield orjson.dumps([entry(e) for e in entries[start : start + PIECE]])[1:-1]


def _kept_entry(k: Kept) -> dict[str, Any]:
    return {"checkpoint_id": k.checkpoint_id, "step": k.step, "reasons": k.reasons}


def kept_pieces(kept: Sequence[Kept]) -> Iterator[bytes]:
    """Kept checkpoints as a plan's answer lists them, in json_pieces. Encoded where they
    were evaluated, a helper's kept checkpoints cross the pipe as bytes, and the process
    that answers (one, whatever the number of helpers) neither unpickles nor encodes them:
    split in two, a million-checkpoint plan's answer was written 0.14 s sooner, its share
    of the encoding falling as the helpers grow in number."""
    return json_pieces(kept, _kept_entry)


def encode_kept(part: PlanPart) -> None:
    """Turn the part's kept checkpoints into JSON pieces (PlanInputs.kept_as_json)."""
    part.kept_json = [*kept_pieces(part.kept), *part.kept_json]
    part.kept = []


def _columns(rows: list[Any]) -> list[tuple[Any, ...]]:
    return list(zip(*rows, strict=True))


def _rows(kind: type[_T], columns: list[tuple[Any, ...]]) -> list[_T]:
    new = tuple.__new__  # as load_scope builds snapshots: not the named tuple's __new__
    return [new(kind, row) for row in zip(*columns, strict=True)]


def evaluate_scope(inputs: PlanInputs, scope: Scope) -> PlanPart:
    """The engine over every run of `scope`, less the demotions not worth their early-
    deletion penalty, the work waiting after a failure and the locked checkpoints. Explained,
    each action is priced and says when its saving starts."""
    now, explain, due, failures, locks = (
        inputs.now,
        inputs.explain,
        inputs.due,
        inputs.failures,
        inputs.locks,
    )
    policy, policies = inputs.policy, inputs.policies
    waits = planned_again_at(failures, locks) if due else {}
    ranks = {t.name: t.rank for t in inputs.tiers}
    prices = {t.name: effective_price(t) for t in inputs.tiers}
    billed = {t.name: t.provider.billed_after_delete for t in inputs.tiers}
    pricer = ActionPricer(prices, now)
    part = PlanPart()
    per_project: dict[str, list[PlannedAction]] = defaultdict(list)
    notes: dict[tuple[str, str | None, str | None, frozenset[str]], str | None] = {}
    for run in scope.runs:
        checkpoints = scope.checkpoints.get(run.id, [])
        governing = policy or select_policy(policies, run)
        shadows_here = shadows_of(policies, run) if inputs.shadowing else []
        if shadows_here:
            part.shadowed[run.id] = shadows_here
        if due:
            # (usually nothing waits: then no lookup per checkpoint, a million of them)
            also = [t for c in checkpoints for t in waits.get(c.id, ())] if waits else []
            found = next_change(governing, run, checkpoints, now, also, live_only=True)
            for shadow_policy in shadows_here:  # due when any of its plans may change
                other = next_change(shadow_policy, run, checkpoints, now, also, live_only=True)
                found = min((t for t in (found, other) if t is not None), default=None)
            part.next_due.append((run.id, run.next_due_at, found))
        if governing is None:
            if not explain:
                continue
            part.kept.extend(
                Kept(c.id, c.step, ("no policy governs this run",)) for c in checkpoints
            )
            continue
        result = evaluate(
            governing,
            run,
            checkpoints,
            now,
            tier_ranks=ranks,
            resumed_by_active=scope.resumed_by_active,
            explain=explain,
            live_only=True,  # load_scope reads the run's active checkpoints alone
        )
        result = skip_costly_demotions(
            result,
            governing,
            run,
            checkpoints,
            now,
            tier_ranks=ranks,
            prices=prices,
            resumed_by_active=scope.resumed_by_active,
        )
        actions, waiting = not_yet_again(list(result.actions), failures, now)
        actions, locked = hold_back_locked(actions, locks)
        if explain and actions:
            by_id = {c.id: c for c in checkpoints}
            for i, a in enumerate(actions):
                checkpoint = by_id[a.checkpoint_id]
                key = (a.checkpoint_id, a.kind, a.to_tier)
                part.costs[key], part.changes[key] = pricer.price(a, checkpoint)
                # the same tiers freed the same way say the same: once per plan
                says = (a.kind, a.from_tier, checkpoint.tier, checkpoint.tiers)
                if says in notes:
                    note = notes[says]
                else:
                    note = notes[says] = saving_starts(
                        a, checkpoint, billed, now, inputs.trash_retention
                    )
                if note is not None:  # the same usd_month, from later on
                    actions[i] = a._replace(reason=f"{a.reason}; {note}")
        per_project[run.project].extend(actions)
        part.kept.extend(result.kept)
        part.skipped.extend(result.skipped)
        part.skipped.extend(waiting)
        part.skipped.extend(locked)
    part.per_project = dict(per_project)
    return part


def loaded_by_project(scope: Scope, projects: Collection[str] | None = None) -> dict[str, Loaded]:
    """Per project of the scope (of `projects` only, when given): its runs loaded, and the
    count and bytes of their active checkpoints when there are few enough runs to sum."""
    runs_of: dict[str, list[str]] = defaultdict(list)
    for run in scope.runs:
        if projects is None or run.project in projects:
            runs_of[run.project].append(run.id)
    found: dict[str, Loaded] = {}
    for name, run_ids in runs_of.items():
        if len(run_ids) > LOWER_BOUND_RUNS:
            found[name] = (len(run_ids), None)
            continue
        in_scope = [c for r in run_ids for c in scope.checkpoints.get(r, ())]
        found[name] = (len(run_ids), (len(in_scope), sum(c.size_bytes for c in in_scope)))
    return found


def deleting_projects(part: PlanPart) -> set[str]:
    return {
        name
        for name, actions in part.per_project.items()
        if any(a.kind == ActionKind.DELETE for a in actions)
    }


def merge_parts(parts: Iterable[PlanPart]) -> PlanPart:
    """The parts of disjoint ranges of runs as one (the first part's lists extended)."""
    merged: PlanPart | None = None
    for part in parts:
        if merged is None:
            merged = part
            continue
        for name, actions in part.per_project.items():
            merged.per_project.setdefault(name, []).extend(actions)
        if merged.kept_json:  # what follows encoded pieces is encoded too: the ranges' order
            merged.kept_json.extend(kept_pieces(part.kept))
        else:
            merged.kept.extend(part.kept)
        merged.kept_json.extend(part.kept_json)
        merged.skipped.extend(part.skipped)
        merged.next_due.extend(part.next_due)
        merged.costs.update(part.costs)
        merged.changes.update(part.changes)
        merged.shadowed.update(part.shadowed)
        for name, (runs, sums) in part.loaded.items():
            have_runs, have_sums = merged.loaded.get(name, (0, (0, 0)))
            both = (
                (have_sums[0] + sums[0], have_sums[1] + sums[1])
                if have_sums is not None and sums is not None
                else None
            )
            total_runs = have_runs + runs
            merged.loaded[name] = (total_runs, both if total_runs <= LOWER_BOUND_RUNS else None)
    return merged or PlanPart()
