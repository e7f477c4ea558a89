"""A running transfer says how far it got (`bytes_done`), every few seconds.

The source file is a named pipe the test writes into, so the copy is exactly as far along
as the test lets it be, whatever the machine's speed."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db.models import Action
from app.db.session import session_scope
from app.services.lifecycle.steps import PROGRESS_EVERY
from app.storage.local import CHUNK
from tests.builders import ago, iso, ledger, make_executor, make_run, register, step_dir

HALF = CHUNK  # the copy reads this much at a time: the first half is one read


def bytes_done(app: FastAPI, action_id: str) -> int:
    with session_scope(app.state.session_factory) as session:
        return int(
            session.execute(select(Action.bytes_done).where(Action.id == action_id)).scalar_one()
        )


def wait_for(condition: Any, limit: timedelta) -> bool:
    """Poll `condition` until it holds or `limit` has passed (a deadline, not a guess)."""
    deadline = time.monotonic() + limit.total_seconds()
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def test_bytes_done_grows_while_a_copy_runs(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    root = step_dir(data_dir, "hot", run, 1)
    root.mkdir(parents=True)
    pipe = root / "model.bin"
    os.mkfifo(pipe)
    files = [{"path": "model.bin", "size_bytes": 2 * HALF}]
    response = register(
        client, run["id"], 1, f"file://{root}", files=files, created_at=iso(ago(hours=1))
    )
    assert response.status_code == 201, response.text
    checkpoint = response.json()
    answer = client.post(f"/v1/checkpoints/{checkpoint['id']}/restore", json={"tier": "warm"})
    assert answer.status_code == 202, answer.text
    action_id = answer.json()["id"]

    worker = threading.Thread(
        target=make_executor(app, trash_retention=timedelta(days=7)).drain, daemon=True
    )
    worker.start()
    with open(pipe, "wb") as writer:  # opens once the worker reads
        writer.write(b"a" * HALF)
        writer.flush()
        seen_half = wait_for(lambda: bytes_done(app, action_id) == HALF, PROGRESS_EVERY * 5)
        writer.write(b"b" * HALF)
    worker.join(timeout=60)

    assert seen_half, f"bytes_done never showed {HALF} while the copy waited for the rest"
    (action,) = ledger(client, kind="restore")
    assert action["state"] == "done"
    assert (action["bytes_done"], action["bytes"]) == (2 * HALF, 2 * HALF)
    copied = step_dir(data_dir, "warm", run, 1) / "model.bin"
    assert copied.read_bytes() == b"a" * HALF + b"b" * HALF
