"""Several sweeps at once (replicas of the scheduler, a manual sweep, triggered
evaluations) write each planned action exactly once: one evaluation holds the lock."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.services.lifecycle.sweep import run_sweep
from tests.builders import ledger, make_run, place_checkpoint, put_policy

POLICY = """\
name: default
rules:
  - name: rolling-keep-2
    class: rolling
    keep_last: 2
    action: delete
"""


def test_concurrent_sweeps_write_each_action_once(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, POLICY)
    runs = [make_run(client, name=f"run-{n}") for n in range(4)]
    for run in runs:
        for step in range(1, 6):
            place_checkpoint(client, data_dir, run, step)
    now = datetime.now(UTC)

    def sweep(_: int) -> list[str]:
        _id, created = run_sweep(
            app.state.session_factory, tiers=app.state.tiers, now=now, trigger="schedule"
        )
        return created

    with ThreadPoolExecutor(max_workers=6) as pool:
        created = [ids for ids in pool.map(sweep, range(6))]

    actions = ledger(client)
    # 4 runs x (5 rolling - keep 2 - nothing protected but the resume point, step 5)
    assert len(actions) == 4 * 3
    assert sum(len(ids) for ids in created) == len(actions)
    per_checkpoint = Counter((a["checkpoint_id"], a["kind"]) for a in actions)
    assert max(per_checkpoint.values()) == 1
    assert sum(1 for ids in created if ids) == 1  # the first sweep wrote them all
