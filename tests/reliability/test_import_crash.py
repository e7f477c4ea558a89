"""An import whose process is SIGKILLed mid-tree: the next `ckpt serve` takes it over once
its lease lapses and finishes it from its last batch, with the counts and the catalog an
uninterrupted import gives (nothing registered twice, nothing left out); importing the
tree again afterwards registers nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, select

from app.db.models import AuditEvent, Checkpoint, ImportItem, ImportRow, Run
from tests.client.conftest import Service
from tests.conftest import migrated_database

RUNS, STEPS = 20, 1000  # 20,000 checkpoints: several seconds of batches to kill one in
DEADLINE = 180.0


@pytest.fixture(params=["sqlite", "postgresql"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield from migrated_database(request.param, tmp_path_factory)


def write_tree(root: Path) -> int:
    """RUNS runs of STEPS generic checkpoints, one object each; returns the object count."""
    for run in range(RUNS):
        for step in range(1, STEPS + 1):
            directory = root / f"exp-{run:02d}" / f"step_{step}"
            directory.mkdir(parents=True)
            (directory / "weights.bin").write_bytes(b"w" * (step % 7))
    return RUNS * STEPS


def listing_processes(root: Path) -> list[int]:
    """Pids of the child processes that list `root` for an import (`import_scan`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile, or not a process
            continue
        if "app.services.lifecycle.import_scan" in command and str(root) in command:
            found.append(int(proc.name))
    return found


def gone(root: Path) -> bool:
    """Whether the listing processes of `root` all exit within DEADLINE."""
    deadline = time.monotonic() + DEADLINE
    while listing_processes(root):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def poll(client: httpx.Client, import_id: str, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE
    while True:
        body: dict[str, Any] = client.get(f"/v1/imports/{import_id}", params={"limit": 1}).json()
        if until(body):
            return body
        assert time.monotonic() < deadline, f"import never got there: {body}"
        time.sleep(0.02)


def test_a_killed_import_is_taken_over_and_finished_once(database: str, tmp_path: Path) -> None:
    # The first process SIGKILLs itself right after its second batch commits: killed
    # mid-tree however fast the machine imports, with no race against the test.
    service = Service(
        tmp_path,
        database,
        CKPT_IMPORT_LEASE="2s",
        CKPT_SWEEP_INTERVAL="1h",
        CKPT_CRASH_AT="import.batch_committed#2",
    )
    root = service.tier_dir("hot") / "legacy"
    objects = write_tree(root)
    total = RUNS * STEPS
    service.start()
    try:
        with service.admin() as client:
            started = client.post("/v1/imports", json={"uri": f"file://{root}", "project": "p"})
            assert started.status_code == 202, started.text
            import_id = started.json()["id"]
        assert service.process is not None
        assert service.process.wait(timeout=DEADLINE) == -signal.SIGKILL
        del service.env["CKPT_CRASH_AT"]
        # the child that listed the tree for it notices and exits: nothing lingers
        assert gone(root), f"listing processes outlived the import's: {listing_processes(root)}"

        engine = create_engine(database)
        with engine.connect() as conn:
            left = conn.execute(select(ImportRow).where(ImportRow.id == import_id)).one()
        assert left.state == "running", "the import ended before it could be killed"
        assert 0 < left.registered < total and left.cursor is not None

        service.start()  # a new process: it takes the import over once the lease lapses
        with service.admin() as client:
            done = poll(client, import_id, lambda b: b["state"] != "running")
            assert done["state"] == "done", done["error"]
            assert (done["discovered"], done["registered"], done["existing"]) == (total, total, 0)
            assert done["listed"] == objects and done["runs"] == RUNS

            with engine.connect() as conn:
                checkpoints = conn.execute(select(func.count()).select_from(Checkpoint)).scalar()
                uris = conn.execute(select(func.count(func.distinct(Checkpoint.uri)))).scalar()
                items = conn.execute(
                    select(func.count(func.distinct(ImportItem.uri))).where(
                        ImportItem.import_id == import_id
                    )
                ).scalar()
                all_items = conn.execute(select(func.count()).select_from(ImportItem)).scalar()
                runs = conn.execute(select(func.count()).select_from(Run)).scalar()
                registered = conn.execute(
                    select(func.count())
                    .select_from(AuditEvent)
                    .where(AuditEvent.event == "registered")
                ).scalar()
            assert checkpoints == uris == items == all_items == registered == total
            assert runs == RUNS

            again = client.post("/v1/imports", json={"uri": f"file://{root}", "project": "p"})
            assert again.status_code == 202, again.text
            second = poll(client, again.json()["id"], lambda b: b["state"] != "running")
            assert (second["registered"], second["existing"]) == (0, total)
        assert listing_processes(root) == []  # each import's child ends with it
        engine.dispose()
    finally:
        service.stop()
