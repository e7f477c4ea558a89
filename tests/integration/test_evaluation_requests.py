"""The evaluation a registration asks for is recorded with it in the database, so an API
process that does not evaluate (`ckpt api`) hands the work to any scheduler replica,
and a crash between the two loses nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db.models import Run
from app.scheduler.runtime import Runtime
from tests.builders import ledger, make_run, place_checkpoint, put_policy

POLICY = """\
name: default
rules:
  - name: rolling-keep-2
    class: rolling
    keep_last: 2
    action: delete
"""


def _requested(app: FastAPI, run_id: str) -> object:
    with app.state.session_factory() as session:
        return session.execute(
            select(Run.evaluate_requested_at).where(Run.id == run_id)
        ).scalar_one()


def test_a_scheduler_answers_the_request_an_api_process_recorded(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, POLICY)
    run = make_run(client)
    steps = [place_checkpoint(client, data_dir, run, step) for step in (1, 2, 3)]
    # The app under test evaluates nothing itself, like `ckpt api`.
    assert _requested(app, run["id"]) is not None
    assert ledger(client) == []

    scheduler = Runtime(
        app.state.session_factory,
        app.state.tiers,
        sweep_interval=timedelta(hours=1),
        trash_retention=timedelta(days=7),
        worker=False,
        scheduler=False,
        evaluator=True,
    )
    scheduler.start()
    try:
        assert scheduler.wait_idle(timeout=30)
    finally:
        scheduler.stop()
    assert [(a["checkpoint_id"], a["kind"]) for a in ledger(client)] == [(steps[0]["id"], "delete")]
    assert _requested(app, run["id"]) is None


def test_writing_reservations_ask_for_nothing_until_committed(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    reserved = client.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={
            "step": 5,
            "class": "rolling",
            "uri": f"file://{data_dir}/hot/proj/run-1/step-5",
            "committed": False,
        },
    )
    assert reserved.status_code == 201, reserved.text
    assert _requested(app, run["id"]) is None
    (data_dir / "hot/proj/run-1/step-5").mkdir(parents=True)
    (data_dir / "hot/proj/run-1/step-5/model.pt").write_bytes(b"w")
    committed = client.post(f"/v1/checkpoints/{reserved.json()['id']}/commit")
    assert committed.status_code == 200, committed.text
    assert _requested(app, run["id"]) is not None
