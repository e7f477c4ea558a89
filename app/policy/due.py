"""When a run's plan can next change by the clock alone.

Every answer of the engine that depends on the time is a threshold crossing: a `when.age`
or `keep_within` measured from a checkpoint's `created_at`, a `run_ended` from the run's
end, the 60 s grace, an undelete's protection. Between two crossings the plan of a run
that nothing else touched is the same, so the periodic sweep evaluates only the runs whose
next crossing has come (and those something changed: a registration, a status, a pin, a
finished action, a policy edit), not every run of the catalog. Everything else that can
change a plan is an event the service sees, and marks the run due for.

Calendar thinning (`keep_daily`...) is not on the list: it buckets `created_at` values
against each other, never against now."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from app.domain.plan import CheckpointSnapshot, RunSnapshot
from app.policy.engine import GRACE
from app.policy.schema import Policy


def next_change(
    policy: Policy | None,
    run: RunSnapshot,
    checkpoints: Sequence[CheckpointSnapshot],
    now: datetime,
    also: Iterable[datetime] = (),
    *,
    live_only: bool = False,
) -> datetime | None:
    """The earliest instant after `now` at which `policy`'s plan of `run` can differ from
    its plan at `now` with nothing but the clock moved; None when never. `also` adds
    instants the caller knows of (a failed action planned again, a provider lock ending).
    `live_only`: the caller passes active checkpoints alone (as a whole plan's scope holds).
    The plan at any `t` with `now <= t < next_change(...)` equals the plan at `now`."""
    if policy is None:
        return None  # no policy plans nothing, whenever
    found: datetime | None = None

    def consider(moment: datetime | None) -> None:
        nonlocal found
        if moment is not None and moment > now and (found is None or moment < found):
            found = moment

    for moment in also:
        consider(moment)
    live = checkpoints if live_only else [c for c in checkpoints if c.state == "active"]
    # Only a checkpoint younger than the grace, or protected, crosses either line later:
    # compared first, as a sweep after a policy edit asks this of a million checkpoints.
    young = now - GRACE
    for c in live:
        if c.created_at > young:
            consider(c.created_at + GRACE)
        if c.protected_until is not None:
            consider(c.protected_until)
    ended = run.status != "active" and run.ended_at is not None
    for rule in policy.rules:
        if rule.when.run_ended is not None and ended:
            assert run.ended_at is not None
            consider(run.ended_at + rule.when.run_ended)
        spans = [s for s in (rule.when.age, rule.keep_within) if s is not None]
        if not spans:
            continue
        classes = rule.classes
        for c in live:
            if classes is None or c.klass in classes:
                for span in spans:
                    consider(_plus(c.created_at, span))
    return found


def _plus(moment: datetime, span: timedelta) -> datetime | None:
    try:
        return moment + span
    except OverflowError:  # 999999999d: never
        return None
