"""The backtest's replay on its own (app.cost.backtest): what a person did to a checkpoint
binds the candidate too; a delete keeps the bytes billed in the trash until the purge, an
undelete within the trash brings it back protected, and a run resumed from a checkpoint
protects it while it is active."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import yaml

from app.cost.backtest import (
    APPEARED,
    DELETED,
    RUN_ENDED,
    RUN_STARTED,
    UNDELETED,
    Backtest,
    CheckpointFacts,
    Delta,
    Event,
)
from app.domain.plan import RunSnapshot
from app.policy.loading import validate_policy

T0 = datetime(2026, 1, 5, tzinfo=UTC)
DAY = timedelta(days=1)
WEEK = 7 * DAY
RANKS = {"hot": 0, "cold": 1}
DELETE_ALL_AFTER_A_DAY = validate_policy(
    yaml.safe_load(
        "name: gone\nrules:\n  - {name: gone, class: milestone, when: {age: 1d}, action: delete}"
    ),
    list(RANKS),
)


def facts(n: int, run: str = "r1") -> CheckpointFacts:
    return CheckpointFacts(f"c{n}", run, n, "milestone", 100, T0 + n * timedelta(hours=1), "hot")


def stored(deltas: list[Delta], at: datetime) -> int:
    by_tier: dict[str, int] = defaultdict(int)
    for d in deltas:
        if d.at <= at:
            by_tier[d.tier] += d.bytes
    return sum(by_tier.values())


def test_an_undelete_in_the_trash_brings_the_checkpoint_back_and_protects_it() -> None:
    run = RunSnapshot("r1", "p", "r1", "active")
    replay = Backtest(
        DELETE_ALL_AFTER_A_DAY, [run], [facts(1), facts(2)], tier_ranks=RANKS, trash_retention=WEEK
    )
    events = [
        Event(T0, RUN_STARTED, "r1"),
        Event(facts(1).created_at, APPEARED, "r1", "c1"),
        Event(facts(2).created_at, APPEARED, "r1", "c2"),  # the resume point from now on
        Event(T0 + timedelta(hours=3), DELETED, "r1", "c1"),  # before the policy's delete
        Event(T0 + 3 * DAY, UNDELETED, "r1", "c1"),
    ]
    out = replay.play(events, T0 + 30 * DAY)
    # c1 billed throughout: in the trash for three days, then back; never purged by that
    assert all(stored(out.deltas, T0 + d * DAY) == 200 for d in range(1, 3 + 7))
    # protected for the retention after its undelete, then the candidate deletes it
    assert [(w.checkpoint_id, w.at) for w in out.would] == [("c1", T0 + 10 * DAY)]
    assert stored(out.deltas, T0 + 17 * DAY) == 100  # its own trash week over


def test_a_person_s_delete_binds_the_candidate_and_stays_billed_until_the_purge() -> None:
    run = RunSnapshot("r1", "p", "r1", "active")
    keep_all = validate_policy({"name": "keep", "rules": []}, list(RANKS))
    replay = Backtest(keep_all, [run], [facts(1)], tier_ranks=RANKS, trash_retention=WEEK)
    purged = T0 + 5 * DAY
    events = [
        Event(T0, RUN_STARTED, "r1"),
        Event(facts(1).created_at, APPEARED, "r1", "c1"),
        Event(T0 + DAY, DELETED, "r1", "c1", purged_at=purged),
    ]
    out = replay.play(events, T0 + 30 * DAY)
    assert stored(out.deltas, purged - timedelta(seconds=1)) == 100
    assert stored(out.deltas, purged) == 0
    assert out.would == []


def test_a_resumed_run_protects_its_checkpoint_while_it_is_active() -> None:
    first = RunSnapshot("r1", "p", "r1", "completed", ended_at=T0 + DAY)
    second = RunSnapshot("r2", "p", "r2", "completed", resumed_from="c1", ended_at=T0 + 9 * DAY)
    replay = Backtest(
        DELETE_ALL_AFTER_A_DAY,
        [first, second],
        [facts(1), facts(2)],
        tier_ranks=RANKS,
        trash_retention=timedelta(0),
    )
    events = [
        Event(T0, RUN_STARTED, "r1"),
        Event(facts(1).created_at, APPEARED, "r1", "c1"),
        Event(facts(2).created_at, APPEARED, "r1", "c2"),
        Event(T0 + DAY, RUN_ENDED, "r1"),
        Event(T0 + timedelta(hours=12), RUN_STARTED, "r2"),
        Event(T0 + 9 * DAY, RUN_ENDED, "r2"),
    ]
    out = replay.play(events, T0 + 30 * DAY)
    deleted = {w.checkpoint_id: w.at for w in out.would}
    assert deleted["c2"] < T0 + 3 * DAY  # due a day after it was written
    assert deleted["c1"] == T0 + 10 * DAY  # the first midnight after r2 ended
