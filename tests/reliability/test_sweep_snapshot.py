"""A sweep plans from one consistent view of the catalog and the ledger (PostgreSQL).

Two schedulers and four workers (test_many_processes.py) once showed moves planned a second
time for checkpoints already moved: the sweep read the catalog, evaluated the policies, and
only then read the open actions, each statement in its own snapshot under READ COMMITTED. A
move that finished in between was seen neither as done (the catalog read said `hot`) nor as
open, so the sweep planned it again. The sweep now reads the ledger first. This test makes
the interleaving deterministic: the ledger table is locked when the sweep reaches it, the
move is finished in that window, then the sweep goes on.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, select, update

from app.db.models import Action, Run
from app.db.session import make_session_factory, session_scope
from app.domain.access import SCHEDULER_ACTOR
from app.policy.loading import validate_policy
from app.services.catalog.policies import store_policy
from app.services.lifecycle.sweep import run_sweep
from tests.reliability.harness import Scenario, World, seed, wipe

POLICY = {
    "name": "default",
    "rules": [
        {
            "name": "milestones-cold",
            "class": "milestone",
            "when": {"run_ended": "0s"},
            "action": {"move_to": "cold"},
        }
    ],
}
WAITING_ON_ACTIONS = """
SELECT count(*) FROM pg_locks
WHERE relation = 'actions'::regclass AND NOT granted
"""


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_move_finished_while_a_sweep_evaluates_is_not_planned_again(
    local_world: World, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    wipe(engine)
    factory = make_session_factory(engine)
    tiers = list(local_world.tiers.values())
    now = datetime.now(UTC)
    seeded = seed(local_world, factory, Scenario("move", "hot", "cold"))
    with session_scope(factory) as session:
        store_policy(
            session, validate_policy(POLICY, [t.name for t in tiers]), source="test", now=now
        )
        # the run has ended: its milestones may go cold
        session.execute(update(Run).values(status="completed", ended_at=now))
    cold_uri = local_world.tiers["cold"].parsed.join(seeded.prefix)
    dsn = database_url.replace("+psycopg", "")

    with psycopg.connect(dsn) as worker:  # stands for a worker finishing the move
        worker.execute("LOCK TABLE actions IN ACCESS EXCLUSIVE MODE")
        sweep: Future[list[str]] = Future()

        def sweep_now() -> None:
            try:
                _, ids = run_sweep(
                    factory, tiers=tiers, now=now, trigger="schedule", actor=SCHEDULER_ACTOR
                )
                sweep.set_result(ids)
            except BaseException as error:
                sweep.set_exception(error)

        threading.Thread(target=sweep_now, daemon=True).start()
        with psycopg.connect(dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 30
            while watcher.execute(WAITING_ON_ACTIONS).fetchone() != (1,):
                assert not sweep.done(), sweep.result()
                assert time.monotonic() < deadline, "the sweep never reached the ledger"
                time.sleep(0.01)
        # What a worker's switch and finish commit (the bytes are not under test here).
        worker.execute(
            "UPDATE locations SET tier = 'cold', uri = %s WHERE checkpoint_id = %s",
            (cold_uri, seeded.checkpoint_id),
        )
        worker.execute(
            "UPDATE checkpoints SET tier = 'cold', uri = %s WHERE id = %s",
            (cold_uri, seeded.checkpoint_id),
        )
        worker.execute(
            "UPDATE actions SET state = 'done', step = 'switched' WHERE id = %s",
            (seeded.action_id,),
        )
        worker.commit()

    assert sweep.result(timeout=30) == []  # the checkpoint is on cold: nothing to move
    with session_scope(factory) as session:
        moves = session.execute(
            select(Action.id).where(Action.checkpoint_id == seeded.checkpoint_id)
        ).all()
    assert len(moves) == 1
