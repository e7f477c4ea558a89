"""Locations never overlap: nothing that nobody deleted is ever lost (DESIGN sections 5, 8).

Each test runs on local directories, on S3 (moto) and on GCS (fake-gcs-server), against
SQLite and PostgreSQL; what a tier holds is read straight from the provider."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.db.models import Checkpoint, Location
from app.db.session import session_scope
from app.settings import Settings
from tests.builders import (
    PROBLEM_JSON,
    ago,
    end_run,
    fetch_checkpoint,
    ledger,
    make_executor,
    make_run,
    put_policy,
    register,
    sweep_now,
)
from tests.integration.stores import KINDS, Store

FILES = {"model.safetensors": b"weights " * 40, "optim/state.pt": b"moments " * 30}
MOVE_ROLLING_COLD = """\
name: default
rules:
  - name: rolling-cold
    class: rolling
    action: {move_to: cold}
"""


def entries(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {"path": p, "size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
        for p, d in sorted(files.items())
    ]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, data_dir: Any) -> Store:
    kind = request.param
    s3 = request.getfixturevalue("moto_s3") if kind == "s3" else None
    gs = request.getfixturevalue("fake_gcs") if kind == "gcs" else None
    return Store(kind, data_dir, s3, gs)


@pytest.fixture
def settings(settings: Settings, store: Store) -> Settings:
    return store.settings(settings)


def created(response: Any) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def refused_for(response: Any, other: dict[str, Any]) -> None:
    """A 409 problem on `uri` naming the other checkpoint."""
    assert response.status_code == 409, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    problem = response.json()
    assert problem["field"] == "uri"
    assert problem["checkpoint_id"] == other["id"]
    assert other["id"] in problem["detail"]


def drain(app: FastAPI) -> None:
    make_executor(app, trash_retention=timedelta(0)).drain()


def share_location(app: FastAPI, checkpoint: dict[str, Any], uri: str) -> None:
    """Point a checkpoint at `uri` behind the API's back: a catalog written before
    locations were kept apart."""
    with session_scope(app.state.session_factory) as session:
        session.execute(update(Checkpoint).where(Checkpoint.id == checkpoint["id"]).values(uri=uri))
        session.execute(
            update(Location).where(Location.checkpoint_id == checkpoint["id"]).values(uri=uri)
        )


# --- registration ---------------------------------------------------------------------------


def test_the_same_uri_in_two_projects_is_refused(client: TestClient, store: Store) -> None:
    alpha = make_run(client, "alpha", "run-1")
    beta = make_run(client, "beta", "run-1")
    uri = store.write("hot", "llama/run-1/step-1200", FILES)
    first = created(register(client, alpha["id"], 1200, uri, files=entries(FILES)))

    refused_for(register(client, beta["id"], 1200, uri, files=entries(FILES)), first)
    refused_for(register(client, beta["id"], 1200, uri), first)  # listed: the same answer

    assert client.get(f"/v1/runs/{beta['id']}/checkpoints").json()["items"] == []
    again = register(client, alpha["id"], 1200, uri, files=entries(FILES))
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def test_a_parent_or_a_child_of_a_location_is_refused(client: TestClient, store: Store) -> None:
    run = make_run(client, "alpha", "run-1")
    other = make_run(client, "beta", "run-2")
    step_uri = store.write("hot", "llama/run-1/step-100", FILES)
    store.write("hot", "llama/run-1/step-200", FILES)
    step = created(register(client, run["id"], 100, step_uri, files=entries(FILES)))

    parent = store.uri("hot", "llama/run-1")
    refused_for(register(client, other["id"], 1, parent), step)
    child = store.uri("hot", "llama/run-1/step-100/optim")
    refused_for(register(client, other["id"], 2, child, files=entries({"state.pt": b"x"})), step)
    # the same run may not claim it under a second step either
    refused_for(register(client, run["id"], 101, step_uri, files=entries(FILES)), step)

    whole = created(register(client, other["id"], 3, store.write("hot", "tree", FILES)))
    refused_for(register(client, run["id"], 300, store.uri("hot", "tree/optim")), whole)


def test_a_reservation_holds_its_place(client: TestClient, store: Store) -> None:
    run = make_run(client, "alpha", "run-1")
    other = make_run(client, "beta", "run-1")
    uri = store.uri("hot", "llama/run-1/step-7")
    reserved = created(register(client, run["id"], 7, uri, committed=False))

    refused_for(register(client, other["id"], 7, uri, committed=False), reserved)
    store.write("hot", "llama/run-1/step-7", FILES)
    refused_for(register(client, other["id"], 8, store.uri("hot", "llama/run-1")), reserved)


# --- what the worker removes --------------------------------------------------------------


def test_a_purge_never_deletes_another_checkpoints_bytes(
    client: TestClient, app: FastAPI, store: Store
) -> None:
    """The reproduction: the same directory catalogued twice (before this rule) and one of
    them deleted; and a parent directory catalogued over a step directory."""
    alpha = make_run(client, "alpha", "run-1")
    beta = make_run(client, "beta", "run-1")
    uri = store.write("hot", "llama/run-1/step-1200", FILES)
    first = created(register(client, alpha["id"], 1200, uri, files=entries(FILES)))
    second = created(
        register(client, beta["id"], 1200, store.write("hot", "b", FILES), files=entries(FILES))
    )
    share_location(app, second, uri)
    parent = created(
        register(client, beta["id"], 1, store.write("hot", "c", FILES), files=entries(FILES))
    )
    share_location(app, parent, store.uri("hot", "llama/run-1"))

    report = client.get("/v1/reconcile").json()
    overlaps = {(d["checkpoint_id"], d["other_checkpoint_id"]) for d in report["drift"]}
    assert {(first["id"], second["id"]), (second["id"], first["id"])} <= overlaps
    assert {(parent["id"], first["id"]), (first["id"], parent["id"])} <= overlaps
    assert {d["problem"] for d in report["drift"] if d["checkpoint_id"] == second["id"]} == {
        "overlap"
    }  # (the parent's manifest was written for another place: its files show as missing)
    assert fetch_checkpoint(client, second["id"])["health"] == "drift"

    for victim in (first, parent):
        assert client.delete(f"/v1/checkpoints/{victim['id']}").status_code == 202
    drain(app)

    purges = ledger(client, kind="purge")
    assert {p["checkpoint_id"] for p in purges} == {first["id"], parent["id"]}
    for purge in purges:
        assert purge["state"] == "failed", purge
        assert "refusing to purge" in purge["error"]
        others = {first["id"], second["id"]} - {purge["checkpoint_id"]}
        assert any(other in purge["error"] for other in others), purge["error"]
        assert purge["attempts"] == 1  # no retrying what waiting cannot change
    assert store.under("hot", "llama/run-1/step-1200") == FILES
    assert fetch_checkpoint(client, second["id"])["state"] == "active"
    drain(app)  # the scheduler does not retry a refused purge every 30 s
    assert len(ledger(client, kind="purge")) == 2


def test_a_move_leaves_a_shared_source_in_place(
    client: TestClient, app: FastAPI, store: Store
) -> None:
    alpha = make_run(client, "alpha", "run-1")
    beta = make_run(client, "beta", "run-1")
    uri = store.write("hot", "shared/step-5", FILES)
    created_at = "2026-01-01T00:00:00Z"
    moving = created(
        register(client, alpha["id"], 5, uri, files=entries(FILES), created_at=created_at)
    )
    staying = created(
        register(
            client,
            beta["id"],
            5,
            store.write("hot", "elsewhere", FILES),
            files=entries(FILES),
            created_at=created_at,
        )
    )
    share_location(app, staying, uri)
    put_policy(client, MOVE_ROLLING_COLD)
    end_run(client, alpha["id"], ago(days=300))  # beta's only checkpoint: its resume point

    sweep_now(client)
    drain(app)

    (move,) = ledger(client, kind="move")
    assert move["checkpoint_id"] == moving["id"] and move["state"] == "failed"
    assert "refusing to remove the source" in move["error"] and staying["id"] in move["error"]
    assert store.under("hot", "shared/step-5") == FILES
    moved = fetch_checkpoint(client, moving["id"])
    assert moved["tier"] == "cold"
    assert moved["uri"] == moved["locations"][0]["uri"] == store.uri("cold", "alpha/run-1/step-5")
    assert store.under("cold", "alpha/run-1/step-5") == FILES


def test_a_placement_never_writes_where_another_checkpoint_lives(
    client: TestClient, app: FastAPI, store: Store
) -> None:
    run = make_run(client, "p", "r")
    squatter_run = make_run(client, "q", "s")
    mine = created(
        register(client, run["id"], 5, store.write("hot", "mine", FILES), files=entries(FILES))
    )
    theirs = {"weights.bin": b"not yours " * 10}
    squatter = created(
        register(
            client,
            squatter_run["id"],
            1,
            store.write("cold", "p/r/step-5", theirs),
            files=entries(theirs),
        )
    )

    answer = client.post(f"/v1/checkpoints/{mine['id']}/restore", json={"tier": "cold"})
    assert answer.status_code == 202, answer.text
    drain(app)

    (copy,) = ledger(client, kind="restore")
    assert copy["state"] == "failed"
    assert "refusing to write a copy to" in copy["error"] and squatter["id"] in copy["error"]
    assert store.under("cold", "p/r/step-5") == theirs
    assert [loc["tier"] for loc in fetch_checkpoint(client, mine["id"])["locations"]] == ["hot"]


# --- single-file checkpoints ----------------------------------------------------------------


def test_a_single_file_checkpoint_lives_its_whole_life(
    client: TestClient, app: FastAPI, store: Store
) -> None:
    """Registered by listing and by manifest; moved under its step keeping its name; its
    sibling untouched by the purge; restored; reconciled clean."""
    run = make_run(client, "p", "r")
    late, early = b"step 1200 " * 50, b"step 800 " * 40
    store.put("hot", "lightning/epoch=3-step=1200.ckpt", late)
    store.put("hot", "lightning/epoch=2-step=800.ckpt", early)
    at = "2026-01-01T00:00:00Z"
    listed = created(
        register(
            client,
            run["id"],
            1200,
            store.uri("hot", "lightning/epoch=3-step=1200.ckpt"),
            created_at=at,
        )
    )
    assert listed["files"][0]["path"] == "epoch=3-step=1200.ckpt"
    assert listed["size_bytes"] == len(late)
    given = created(
        register(
            client,
            run["id"],
            800,
            store.uri("hot", "lightning/epoch=2-step=800.ckpt"),
            files=entries({"epoch=2-step=800.ckpt": early}),
            created_at=at,
        )
    )
    refused_for(register(client, run["id"], 1, store.uri("hot", "lightning")), listed)

    put_policy(client, MOVE_ROLLING_COLD)
    end_run(client, run["id"], ago(days=300))
    sweep_now(client)
    drain(app)

    assert {a["state"] for a in ledger(client, kind="move")} == {"done"}
    assert store.objects("hot") == {}
    assert store.under("cold", "p/r/step-1200") == {"epoch=3-step=1200.ckpt": late}
    assert store.under("cold", "p/r/step-800") == {"epoch=2-step=800.ckpt": early}
    moved = fetch_checkpoint(client, listed["id"])
    assert moved["uri"] == store.uri("cold", "p/r/step-1200/epoch=3-step=1200.ckpt")
    report = client.get("/v1/reconcile").json()
    assert (report["orphans"], report["drift"]) == ([], [])

    assert client.delete(f"/v1/checkpoints/{given['id']}").status_code == 202
    restore = client.post(f"/v1/checkpoints/{listed['id']}/restore", json={"tier": "hot"})
    assert restore.status_code == 202, restore.text
    drain(app)

    assert store.under("cold", "p/r/step-800") == {}
    assert store.under("cold", "p/r/step-1200") == {"epoch=3-step=1200.ckpt": late}
    assert store.under("hot", "p/r/step-1200") == {"epoch=3-step=1200.ckpt": late}
    assert fetch_checkpoint(client, given["id"])["state"] == "deleted"
    report = client.get("/v1/reconcile").json()
    assert (report["orphans"], report["drift"]) == ([], [])
