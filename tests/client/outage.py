"""A training loop that keeps going while the catalog is down, and what the catalog must
hold once it is back: the two outage test modules share it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ckpt_client import Client, Run
from tests.builders import list_all
from tests.client.conftest import Service
from tests.client.helpers import manifest_of, write_step

DEADLINE = 1.0  # the client's per-call deadline in these tests
# A call may overrun its deadline by its last attempt's end (a refused connection is at
# once) and the spool file's fsync, which a disk busy with a whole test suite beside it
# has been seen to hold for 0.6 s: well under this.
SLACK = 1.0
BEFORE = range(1, 4)  # registered while the service is up
DURING = range(4, 24)  # the 20 registrations of the outage


def train_through_an_outage(
    service: Service, client: Client, project: str
) -> tuple[Run, datetime, list[float]]:
    """Three registrations, then the service stops for 20 registrations and the run's
    end, each timed; returns the run, when it ended (by the job's clock) and how long
    each of the 21 calls held the loop."""
    run = client.run(project, "run-1")
    for step in BEFORE:
        assert run.register(step, write_step(service.tier_dir("hot"), project, "run-1", step))
    service.stop()
    durations: list[float] = []
    for step in DURING:
        root = write_step(service.tier_dir("hot"), project, "run-1", step)
        started = time.monotonic()
        answer = run.register(step, root, files=manifest_of(root), metrics={"loss": 1 / step})
        durations.append(time.monotonic() - started)
        assert answer is None  # spooled
    ended = datetime.now(UTC)
    started = time.monotonic()
    run.complete()
    durations.append(time.monotonic() - started)
    assert len(durations) == 21
    assert max(durations) <= DEADLINE + SLACK, durations
    assert run.status == "completed"
    assert len(client.spool.pending()) == 21
    return run, ended, durations


def figure(durations: list[float], how: str) -> str:
    return (
        f"client outage ({how}): 21 calls spooled, each held the loop "
        f"{min(durations):.2f}-{max(durations):.2f}s (deadline {DEADLINE:g}s)"
    )


def assert_landed_once_in_order(service: Service, run: Run, ended: datetime) -> None:
    """Every registration is in the catalog once, registered in the order the job made
    them, and the run ended after its last one, at the time the job ended it."""
    with service.admin() as admin:
        checkpoints, _ = list_all(admin, f"/v1/runs/{run.id}/checkpoints", 1000)
        events, _ = list_all(admin, "/v1/audit", 1000, run_id=run.id)
        record: dict[str, Any] = admin.get(f"/v1/runs/{run.id}").json()
    steps = list(BEFORE) + list(DURING)
    assert sorted(c["step"] for c in checkpoints) == steps
    assert {c["state"] for c in checkpoints} == {"active"}
    by_step = {c["step"]: c for c in checkpoints}
    for step in DURING:
        assert by_step[step]["metrics"] == {"loss": 1 / step}
    registered = [e for e in events if e["entity"] == "checkpoint" and e["event"] == "registered"]
    assert [e["after"]["step"] for e in registered] == steps  # once each, in order
    ends = [e for e in events if e["entity"] == "run" and e["event"] == "updated"]
    assert len(ends) == 1 and ends[0]["after"]["status"] == "completed"
    assert ends[0]["id"] > registered[-1]["id"]
    assert record["status"] == "completed"
    assert abs((datetime.fromisoformat(record["ended_at"]) - ended).total_seconds()) < 5
    # a spooled registration keeps the time the job made it, not the time it landed
    made = [datetime.fromisoformat(by_step[s]["created_at"]) for s in DURING]
    assert made == sorted(made) and max(made) <= ended
