"""Reconciliation on local tiers (SQLite and PostgreSQL): what `GET /v1/reconcile` calls an
orphan and drift, what it marks on the checkpoint, and that orphans go only when an admin
asks, only if still orphaned and old enough. The same on S3 and GCS is in
test_reconcile_objects.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.builders import (
    assert_problem,
    fetch_checkpoint,
    make_executor,
    make_run,
    place_checkpoint,
    register,
    step_dir,
    tree,
)

HOUR = 3600


def reconcile(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/reconcile", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def stray(path: Path, data: bytes = b"left behind", age_s: float = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_a_catalog_that_matches_its_tiers_reports_nothing(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    for step in (100, 200):
        place_checkpoint(client, data_dir, run, step)
    body = reconcile(client)
    assert body["orphans"] == [] and body["drift"] == []
    assert body["scanned_objects"] == 4  # two files per checkpoint
    assert body["unreachable"] == {}


def test_objects_no_checkpoint_owns_are_orphans_and_stay_until_an_admin_asks(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    kept = place_checkpoint(client, data_dir, run, 100)
    hot = data_dir / "hot"
    left = stray(step_dir(data_dir, "hot", run, 999) / "shard-0.bin", age_s=2 * HOUR)
    fresh = stray(hot / "incoming" / "being-written.bin")  # a job writing before it registers
    partial = stray(hot / "proj" / ".x.partial-0123", age_s=2 * HOUR)  # a crashed upload's

    body = reconcile(client)
    found = {(o["tier"], o["key"]) for o in body["orphans"]}
    assert found == {
        ("hot", "proj/run-1/step-999/shard-0.bin"),
        ("hot", "incoming/being-written.bin"),
        ("hot", "proj/.x.partial-0123"),
    }
    by_key = {o["key"]: o for o in body["orphans"]}
    assert by_key["incoming/being-written.bin"]["uri"] == f"file://{fresh}"
    assert by_key["proj/run-1/step-999/shard-0.bin"]["size_bytes"] == len(b"left behind")
    assert left.exists() and fresh.exists() and partial.exists()  # a scan deletes nothing
    assert body["drift"] == []

    catalogued = "proj/run-1/step-100/shard-0.bin"
    response = client.post(
        "/v1/reconcile/orphans/delete",
        json={
            "orphans": [
                {"tier": "hot", "key": "proj/run-1/step-999/shard-0.bin"},
                {"tier": "hot", "key": "incoming/being-written.bin"},
                {"tier": "hot", "key": catalogued},  # owned: never deleted
            ]
        },
    )
    assert response.status_code == 200, response.text
    result = response.json()
    assert [o["key"] for o in result["deleted"]] == ["proj/run-1/step-999/shard-0.bin"]
    refused = {r["key"]: r["reason"] for r in result["refused"]}
    assert "less than" in refused["incoming/being-written.bin"]
    assert "not an orphan" in refused[catalogued]
    assert not left.exists() and fresh.exists() and partial.exists()
    assert tree(step_dir(data_dir, "hot", run, 100)) != {}
    assert fetch_checkpoint(client, kept["id"])["health"] == "ok"

    response = client.post("/v1/reconcile/orphans/delete", json={"all": True})
    assert response.status_code == 200, response.text
    assert [o["key"] for o in response.json()["deleted"]] == ["proj/.x.partial-0123"]
    assert not partial.exists() and fresh.exists()
    assert tree(step_dir(data_dir, "hot", run, 100)) != {}


def test_a_deletion_request_must_say_which_orphans(client: TestClient) -> None:
    for body in ({}, {"all": True, "orphans": []}, {"orphans": [{"tier": "hot"}]}):
        response = client.post("/v1/reconcile/orphans/delete", json=body)
        assert_problem(response, 422, "orphans")


def test_missing_and_changed_files_are_drift_and_mark_the_checkpoint_until_fixed(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    gone = place_checkpoint(client, data_dir, run, 100)
    grown = place_checkpoint(client, data_dir, run, 200)
    flipped = place_checkpoint(client, data_dir, run, 300)
    whole = place_checkpoint(client, data_dir, run, 400)
    removed = step_dir(data_dir, "hot", run, 100) / "shard-1.bin"
    original = removed.read_bytes()
    removed.unlink()
    (step_dir(data_dir, "hot", run, 200) / "shard-0.bin").write_bytes(b"x" * 65)
    target = step_dir(data_dir, "hot", run, 300) / "shard-0.bin"
    target.write_bytes(bytes(b ^ 1 for b in target.read_bytes()))  # same size, other bytes

    shallow = {d["checkpoint_id"]: d for d in reconcile(client)["drift"]}
    assert shallow[gone["id"]]["problem"] == "missing"
    assert shallow[gone["id"]]["key"] == "proj/run-1/step-100/shard-1.bin"
    assert shallow[grown["id"]]["problem"] == "size: catalogued 64 bytes, found 65"
    # a local directory reports no checksum: only a deep scan reads the bytes
    assert flipped["id"] not in shallow and whole["id"] not in shallow
    deep = {d["checkpoint_id"]: d for d in reconcile(client, deep=True)["drift"]}
    assert set(deep) == {gone["id"], grown["id"], flipped["id"]}
    assert deep[flipped["id"]]["problem"].startswith("sha256: catalogued ")

    marked = fetch_checkpoint(client, gone["id"])
    assert marked["health"] == "drift"
    assert "missing" in marked["health_detail"] and "shard-1.bin" in marked["health_detail"]
    assert fetch_checkpoint(client, whole["id"])["health"] == "ok"
    assert reconcile(client)["orphans"] == []  # drift is no orphan

    removed.write_bytes(original)  # put back: the next scan clears the mark
    reconcile(client, deep=True)
    assert fetch_checkpoint(client, gone["id"])["health"] == "ok"
    assert fetch_checkpoint(client, grown["id"])["health"] == "drift"
    # both changes of health are in the audit trail, once each, with who asked and why
    trail = client.get("/v1/audit", params={"checkpoint_id": gone["id"]}).json()["items"]
    health = [(e["event"], e["actor"], e["reason"], e["after"]) for e in trail]
    health = [h for h in health if h[0] in ("drifted", "healed")]
    assert [(event, actor, reason) for event, actor, reason, _ in health] == [
        ("drifted", "anonymous", "reconciliation"),
        ("healed", "anonymous", "reconciliation"),
    ]
    assert health[0][3]["health"] == "drift" and "missing" in health[0][3]["health_detail"]


def test_what_is_being_written_or_moved_is_no_orphan(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    reserved = step_dir(data_dir, "hot", run, 50)
    stray(reserved / "shard-0.bin", age_s=2 * HOUR)  # an asynchronous save, not committed
    response = register(client, run["id"], 50, f"file://{reserved}", "rolling", committed=False)
    assert response.status_code == 201, response.text
    trashed = place_checkpoint(client, data_dir, run, 100)
    assert client.delete(f"/v1/checkpoints/{trashed['id']}").status_code == 202
    make_executor(app).drain()
    assert fetch_checkpoint(client, trashed["id"])["state"] == "trashed"

    body = reconcile(client)
    assert body["orphans"] == [] and body["drift"] == []  # trashed bytes are still owned
    response = client.post("/v1/reconcile/orphans/delete", json={"all": True})
    assert response.json()["deleted"] == []
    assert tree(reserved) != {} and tree(step_dir(data_dir, "hot", run, 100)) != {}


def test_bytes_a_crashed_purge_left_are_orphans(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    from datetime import timedelta

    run = make_run(client)
    doomed = place_checkpoint(client, data_dir, run, 100)
    saved = tree(step_dir(data_dir, "hot", run, 100))
    assert client.delete(f"/v1/checkpoints/{doomed['id']}").status_code == 202
    executor = make_executor(app, trash_retention=timedelta(0))
    executor.drain()
    assert fetch_checkpoint(client, doomed["id"])["state"] == "deleted"
    for path, data in saved.items():  # as if the purge died before its deletes landed
        stray(step_dir(data_dir, "hot", run, 100) / path, data)
    keys = {o["key"] for o in reconcile(client)["orphans"]}
    assert keys == {f"proj/run-1/step-100/{path}" for path in saved}


def test_reconciliation_needs_an_admin(auth_client: TestClient, admin_client: TestClient) -> None:
    assert auth_client.get("/v1/reconcile").status_code == 401
    assert admin_client.get("/v1/reconcile").status_code == 200


def test_the_scheduler_reconciles_on_its_own_and_only_when_asked_to(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    from datetime import timedelta

    from app.scheduler.runtime import Runtime

    run = make_run(client)
    broken = place_checkpoint(client, data_dir, run, 100)
    (step_dir(data_dir, "hot", run, 100) / "shard-0.bin").unlink()

    def scheduler(every: timedelta) -> Runtime:
        return Runtime(
            app.state.session_factory,
            app.state.tiers,
            sweep_interval=timedelta(hours=1),
            trash_retention=timedelta(days=7),
            reconcile_interval=every,
            worker=False,
            evaluator=False,
        )

    off = scheduler(timedelta(0))  # CKPT_RECONCILE_INTERVAL=0s: no periodic job at all
    off.start()
    try:
        assert off._scheduler is not None
        assert off._scheduler.get_job("reconcile") is None
    finally:
        off.stop()

    on = scheduler(timedelta(milliseconds=200))
    on.start()
    try:
        deadline = time.monotonic() + 20
        while fetch_checkpoint(client, broken["id"])["health"] != "drift":
            assert time.monotonic() < deadline, "the scheduled reconciliation never ran"
            time.sleep(0.05)
    finally:
        on.stop()
    trail = client.get("/v1/audit", params={"checkpoint_id": broken["id"]}).json()["items"]
    assert [e["actor"] for e in trail if e["event"] == "drifted"] == ["system:reconcile"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_one_scheduler_reconciles_at_a_time(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """Several schedulers would only repeat each other's listings: while one holds the
    turn, another's periodic reconciliation skips, and takes it once it is free."""
    from datetime import timedelta

    from app.scheduler.runtime import Runtime
    from app.services.lifecycle.reconcile import turn

    run = make_run(client)
    broken = place_checkpoint(client, data_dir, run, 100)
    (step_dir(data_dir, "hot", run, 100) / "shard-0.bin").unlink()
    other = Runtime(
        app.state.session_factory,
        app.state.tiers,
        sweep_interval=timedelta(hours=1),
        trash_retention=timedelta(days=7),
        worker=False,
        scheduler=False,
        evaluator=False,
    )
    with turn(app.state.session_factory) as mine:
        assert mine
        other.reconcile()  # skips: this test holds the turn
        assert fetch_checkpoint(client, broken["id"])["health"] == "ok"
        with turn(app.state.session_factory) as theirs:
            assert not theirs
    other.reconcile()
    assert fetch_checkpoint(client, broken["id"])["health"] == "drift"
