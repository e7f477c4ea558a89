"""What the framework tests share: the catalog as an admin sees it, policies put for a
test's own project, sweeps run to their end (actions and purges done), and a training
process read line by line and killed."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import update

from app.db.models import Checkpoint as CheckpointRow
from app.db.session import make_engine, make_session_factory, session_scope

DEADLINE = 90.0
T = TypeVar("T")


def poll(what: str, probe: Callable[[], T | None], deadline: float = DEADLINE) -> T:
    """`probe()` once it answers something truthy, within `deadline` seconds."""
    until = time.monotonic() + deadline
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"not within {deadline}s: {what}")
        time.sleep(0.1)


def put_policy(admin: httpx.Client, project: str, rules: list[dict[str, Any]]) -> None:
    body = {"applies_to": {"projects": [project]}, "priority": 100, "rules": rules}
    answer = admin.put(f"/v1/policies/{project}", json=body)
    assert answer.status_code == 200, answer.text


def run_of(admin: httpx.Client, project: str) -> dict[str, Any]:
    items = admin.get("/v1/runs", params={"project": project}).json()["items"]
    assert len(items) == 1, items
    run: dict[str, Any] = items[0]
    return run


def checkpoints(admin: httpx.Client, run_id: str) -> dict[int, dict[str, Any]]:
    answer = admin.get(f"/v1/runs/{run_id}/checkpoints", params={"limit": 500})
    return {c["step"]: c for c in answer.json()["items"]}


def back_date(catalog_url: str, run_id: str) -> None:
    """Age the run's checkpoints past the 60 s grace that protects fresh ones (the
    trainings here take seconds): what waiting a minute would do."""
    engine = make_engine(catalog_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            session.execute(
                update(CheckpointRow)
                .where(CheckpointRow.run_id == run_id)
                .values(created_at=datetime.now(UTC) - timedelta(hours=1))
            )
    finally:
        engine.dispose()


def sweep_and_settle(admin: httpx.Client, project: str) -> None:
    """A sweep, then its actions and their purges run to their end."""
    answer = admin.post("/v1/sweeps", json={"project": project})
    assert answer.status_code == 202, answer.text

    def settled() -> bool:
        actions = admin.get("/v1/actions", params={"limit": 500}).json()["items"]
        return all(a["state"] in ("done", "failed", "cancelled") for a in actions)

    poll("the sweep's actions are done", settled)


def files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


def read_until(process: subprocess.Popen[str], marker: str) -> list[str]:
    """The training's output lines up to the one starting with `marker` (it prints nothing
    else that could fill a pipe); fails if it ends first."""
    assert process.stdout is not None
    lines: list[str] = []
    while True:
        line = process.stdout.readline()
        if not line:
            process.wait(timeout=30)
            stderr = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"exited {process.returncode} before {marker!r}: {stderr[-4000:]}")
        lines.append(line.strip())
        if line.startswith(marker):
            return lines


def kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL the training (a preemption), if it still runs, and close its pipes."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
