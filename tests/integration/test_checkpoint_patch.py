"""PATCH /v1/checkpoints/{id}: re-class a checkpoint (promote the last save to `final`, a
good one to `milestone`), merge its labels and metrics; audited, and its run evaluated
again at once, as after a registration."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update

from app.db.models import Run
from app.main import Roles, create_app
from app.settings import Settings
from tests.builders import (
    assert_problem,
    fetch_checkpoint,
    issue_token,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    token_client,
)

POLICY = """\
name: default
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
"""


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


def patch(client: TestClient, checkpoint_id: str, body: Any) -> Any:
    return client.patch(f"/v1/checkpoints/{checkpoint_id}", json=body)


def ok(client: TestClient, checkpoint_id: str, body: Any) -> dict[str, Any]:
    response = patch(client, checkpoint_id, body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def events(client: TestClient, checkpoint_id: str, name: str) -> list[dict[str, Any]]:
    response = client.get("/v1/audit", params={"checkpoint_id": checkpoint_id})
    assert response.status_code == 200, response.text
    return [e for e in response.json()["items"] if e["event"] == name]


def requested(app: FastAPI, run_id: str) -> object:
    with app.state.session_factory() as session:
        return session.execute(
            select(Run.evaluate_requested_at).where(Run.id == run_id)
        ).scalar_one()


# --- what it changes ---------------------------------------------------------------------------


def test_reclass_answers_the_checkpoint_and_is_audited(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    checkpoint = place_checkpoint(client, data_dir, run, 10)

    body = ok(client, checkpoint["id"], {"class": "final"})

    assert body["class"] == "final" and body["id"] == checkpoint["id"]
    assert {k: v for k, v in body.items() if k not in ("class", "updated_by")} == {
        k: v for k, v in checkpoint.items() if k not in ("class", "updated_by")
    }
    assert fetch_checkpoint(client, checkpoint["id"])["class"] == "final"
    (event,) = events(client, checkpoint["id"], "updated")
    assert (event["before"], event["after"]) == ({"class": "rolling"}, {"class": "final"})
    assert event["actor"] == "anonymous"


def test_labels_and_metrics_merge_and_a_null_removes_a_key(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    checkpoint = place_checkpoint(
        client,
        data_dir,
        run,
        10,
        labels={"team": "pretrain", "draft": "yes"},
        metrics={"loss": 2.5, "acc": 0.5},
    )

    body = ok(
        client,
        checkpoint["id"],
        {"labels": {"draft": None, "eval": "passed"}, "metrics": {"loss": 2.25, "acc": None}},
    )

    assert body["labels"] == {"team": "pretrain", "eval": "passed"}
    assert body["metrics"] == {"loss": 2.25}
    assert body["class"] == "rolling"  # left out: kept
    (event,) = events(client, checkpoint["id"], "updated")
    assert event["before"] == {
        "labels": {"team": "pretrain", "draft": "yes"},
        "metrics": {"loss": 2.5, "acc": 0.5},
    }
    assert event["after"] == {"labels": body["labels"], "metrics": body["metrics"]}
    # removing a key it does not have is no error, and the same PATCH again changes nothing
    again = ok(client, checkpoint["id"], {"labels": {"draft": None, "eval": "passed"}})
    assert again["labels"] == body["labels"]
    assert len(events(client, checkpoint["id"], "updated")) == 1
    assert ok(client, checkpoint["id"], {})["labels"] == body["labels"]
    assert len(events(client, checkpoint["id"], "updated")) == 1


def test_a_reservation_can_be_reclassed_before_it_commits(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = f"file://{(data_dir / 'hot' / 'proj' / 'run-1' / 'step-3').resolve()}"
    reserved = client.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={"step": 3, "class": "rolling", "uri": uri, "committed": False},
    ).json()

    body = ok(client, reserved["id"], {"class": "milestone"})

    assert (body["state"], body["class"]) == ("writing", "milestone")
    assert requested(app, run["id"]) is None  # no rule sees a reservation: nothing to evaluate


def test_a_trashed_checkpoint_can_be_relabelled_but_a_deleted_one_is_a_conflict(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    trashed = place_checkpoint(client, data_dir, run, 10)
    assert client.delete(f"/v1/checkpoints/{trashed['id']}").status_code == 202
    make_executor(app, trash_retention=timedelta(days=7)).drain()
    assert ok(client, trashed["id"], {"labels": {"why": "bad run"}})["state"] == "trashed"
    deleted = place_checkpoint(client, data_dir, run, 11)
    assert client.delete(f"/v1/checkpoints/{deleted['id']}").status_code == 202
    make_executor(app, trash_retention=timedelta(0)).drain()  # to the trash, then purged
    assert fetch_checkpoint(client, deleted["id"])["state"] == "deleted"

    body = assert_problem(patch(client, deleted["id"], {"class": "final"}), 409, "state")

    assert "deleted" in body["detail"]
    assert fetch_checkpoint(client, deleted["id"])["class"] == "rolling"
    assert events(client, deleted["id"], "updated") == []


# --- the run is evaluated again ------------------------------------------------------------------


@pytest.fixture
def evaluating_app(settings: Settings, clean_engine: Engine) -> FastAPI:
    return create_app(
        settings, engine=clean_engine, roles=Roles(worker=False, scheduler=False, evaluator=True)
    )


@pytest.fixture
def evaluating_client(evaluating_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(evaluating_app) as client:
        yield client


def test_a_patch_asks_for_its_runs_evaluation(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    """Recorded in the database with the change, like a registration's: any scheduler
    replica answers it, and a crash loses nothing."""
    checkpoint = place_checkpoint(client, data_dir, run, 10)
    with app.state.session_factory.begin() as session:
        session.execute(update(Run).values(evaluate_requested_at=None))
    ok(client, checkpoint["id"], {"metrics": {"loss": 1.0}})
    assert requested(app, run["id"]) is not None


def test_promoting_a_save_to_milestone_saves_it_from_the_rolling_prune(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    client, runtime = evaluating_client, evaluating_app.state.runtime
    put_policy(client, POLICY)
    run = make_run(client)
    first = place_checkpoint(client, data_dir, run, 1)
    assert runtime.wait_idle(timeout=30)
    ok(client, first["id"], {"class": "milestone"})
    assert runtime.wait_idle(timeout=30)
    second = place_checkpoint(client, data_dir, run, 2)
    third = place_checkpoint(client, data_dir, run, 3)
    assert runtime.wait_idle(timeout=30)
    # rolling-keep-1 prunes step 2, never the milestone
    assert [(a["checkpoint_id"], a["kind"]) for a in ledger(client)] == [(second["id"], "delete")]

    # back to rolling: the next evaluation prunes it like any older rolling save
    ok(client, first["id"], {"class": "rolling"})
    assert runtime.wait_idle(timeout=30)
    planned = {(a["checkpoint_id"], a["kind"]) for a in ledger(client)}
    assert planned == {(second["id"], "delete"), (first["id"], "delete")}
    assert third["id"] not in {a["checkpoint_id"] for a in ledger(client)}


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"class": "Not A Class!"}, "class"),
        ({"class": 5}, "class"),
        ({"class": None}, "class"),
        ({"labels": None}, "labels"),
        ({"metrics": None}, "metrics"),
        ({"labels": {"team": 5}}, "labels"),
        ({"labels": ["team"]}, "labels"),
        ({"labels": {"": "x"}}, "labels"),
        ({"metrics": {"loss": "low"}}, "metrics"),
        ({"metrics": {"loss": True}}, "metrics"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
        ({"state": "active"}, "state"),
        ({"class_": "final"}, "class_"),
        ({"pinned": True}, "pinned"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_changes_nothing(
    client: TestClient, data_dir: Path, run: dict[str, Any], body: Any, field: str
) -> None:
    checkpoint = place_checkpoint(client, data_dir, run, 10)
    assert_problem(patch(client, checkpoint["id"], body), 422, field)
    assert fetch_checkpoint(client, checkpoint["id"])["class"] == "rolling"
    assert events(client, checkpoint["id"], "updated") == []


def test_a_merge_beyond_64_labels_is_refused(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    checkpoint = place_checkpoint(
        client, data_dir, run, 10, labels={f"old{i}": "v" for i in range(40)}
    )
    body = assert_problem(
        patch(client, checkpoint["id"], {"labels": {f"new{i}": "v" for i in range(30)}}),
        422,
        "labels",
    )
    assert "64" in body["detail"]
    assert len(fetch_checkpoint(client, checkpoint["id"])["labels"]) == 40


def test_malformed_json_unknown_id_and_no_body(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    checkpoint = place_checkpoint(client, data_dir, run, 10)
    malformed = client.patch(
        f"/v1/checkpoints/{checkpoint['id']}",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert_problem(malformed, 400)
    assert_problem(patch(client, "ckpt_nothing", {"class": "final"}), 404, "checkpoint_id")
    assert_problem(client.patch(f"/v1/checkpoints/{checkpoint['id']}"), 415, "body")  # no body


# --- access control ------------------------------------------------------------------------------


def test_patch_needs_register_on_the_checkpoints_project(
    auth_app: FastAPI, auth_client: TestClient, admin_client: TestClient, data_dir: Path
) -> None:
    run = make_run(admin_client, project="llama")
    checkpoint = place_checkpoint(admin_client, data_dir, run, 10)
    _, job = issue_token(auth_app, name="job", scopes=("register",), projects=("llama",))
    _, reader = issue_token(auth_app, name="reader", scopes=("read",), projects=("*",))
    _, stranger = issue_token(auth_app, name="other", scopes=("register",), projects=("gpt",))
    path = f"/v1/checkpoints/{checkpoint['id']}"

    assert_problem(auth_client.patch(path, json={"class": "final"}), 401)
    for secret in (reader, stranger):
        assert_problem(token_client(auth_app, secret).patch(path, json={"class": "final"}), 403)
    assert fetch_checkpoint(admin_client, checkpoint["id"])["class"] == "rolling"

    promoted = token_client(auth_app, job).patch(path, json={"class": "final"})
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["updated_by"].endswith(":job")
    (event,) = events(admin_client, checkpoint["id"], "updated")
    assert event["actor"] == promoted.json()["updated_by"]
