"""`ckpt_client.lightning` with the real Lightning on the CPU against a real `ckpt serve`:
the policy alone decides what stays on disk, a save killed mid-write never becomes an
`active` checkpoint, and a killed training resumes from the newest committed step."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import update

from app.db.models import Checkpoint as CheckpointRow
from app.db.session import make_engine, make_session_factory, session_scope
from tests.client.conftest import Service
from tests.frameworks.conftest import Training

SCRIPT = Path(__file__).resolve().parent / "scripts" / "lightning_train.py"
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


def step_file(step: int, epoch: int = 0) -> str:
    return f"epoch={epoch}-step={step}.ckpt"


def test_the_policy_alone_decides_what_stays_on_disk(
    training: Training, service: Service, project: str, catalog_url: str
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    with service.admin() as admin:
        put_policy(
            admin,
            project,
            [{"name": "rolling-keep-2", "class": "rolling", "keep_last": 2, "action": "delete"}],
        )
        training.run(SCRIPT, project, "run-1", str(directory), "12", "2", "--milestone-every", "4")
        written = {step_file(s) for s in (2, 4, 6, 8, 10, 12)}
        assert files(directory) == written  # Lightning removed nothing

        run = run_of(admin, project)
        assert run["status"] == "completed"
        saved = checkpoints(admin, run["id"])
        classes = {step: c["class"] for step, c in saved.items()}
        assert classes == {
            2: "rolling",
            4: "milestone",
            6: "rolling",
            8: "milestone",
            10: "rolling",
            12: "final",
        }
        assert {c["state"] for c in saved.values()} == {"active"}
        assert all("train_loss" in c["metrics"] for c in saved.values())
        assert all(c["uri"] == f"file://{directory / step_file(s)}" for s, c in saved.items())

        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        poll("step 2 is purged", lambda: checkpoints(admin, run["id"])[2]["state"] == "deleted")
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
        assert states == {
            2: "deleted",
            4: "active",
            6: "active",
            8: "active",
            10: "active",
            12: "active",
        }
        assert files(directory) == written - {step_file(2)}
