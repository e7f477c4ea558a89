"""POST /v1/sweeps and the action ledger: every planned action is written before the answer,
sweeps are idempotent, deletes beyond the blast radius wait for approval, GET /v1/actions
filters and pages; and a registration triggers an evaluation of its run off the request path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.main import Roles, create_app
from app.services.lifecycle.sweep import evaluation_lock
from app.settings import Settings
from tests.builders import (
    ago,
    assert_problem,
    end_run,
    fetch_checkpoint,
    ledger,
    list_all,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    step_dir,
    step_files,
    sweep_now,
    tree,
)

POLICY = """\
name: default
rules:
  - name: rolling-keep-3
    class: rolling
    keep_last: 3
    action: delete
  - name: milestones-cold
    class: milestone
    when: {run_ended: 1d}
    action: {move_to: cold}
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
"""


def rolling(
    client: TestClient, data_dir: Path, run: dict[str, Any], steps: range | list[int], **kw: Any
) -> dict[int, dict[str, Any]]:
    return {step: place_checkpoint(client, data_dir, run, step, **kw) for step in steps}


def states(client: TestClient, ids: list[str]) -> list[str]:
    return [client.get(f"/v1/actions/{i}").json()["state"] for i in ids]


def open_keys(client: TestClient) -> list[tuple[str, str, str | None]]:
    return [
        (a["checkpoint_id"], a["kind"], a["to_tier"])
        for a in ledger(client)
        if a["state"] in ("held", "pending", "running")
    ]


@pytest.fixture
def policy(client: TestClient) -> None:
    put_policy(client, POLICY)


# --- sweeps write the plan to the ledger, once ------------------------------------------


@pytest.mark.usefixtures("policy")
def test_sweep_answers_202_with_every_action_in_the_ledger(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    ckpts = rolling(client, data_dir, run, range(1, 6))

    result = sweep_now(client)

    assert result["id"] and len(result["actions"]) == 2
    actions = {a["id"]: a for a in ledger(client)}
    assert set(actions) == set(result["actions"])
    assert sorted(actions[i]["checkpoint_id"] for i in result["actions"]) == sorted(
        ckpts[s]["id"] for s in (1, 2)
    )
    for action in actions.values():
        assert action["sweep_id"] == result["id"]
        assert action["state"] == "pending"
        assert action["kind"] == "delete"
        assert action["rule"] == "default/rolling-keep-3"
        assert "keep_last 3" in action["reason"]
        assert action["run_id"] == run["id"]
        assert action["from_tier"] == "hot"
        assert action["attempts"] == 0
        assert action["bytes"] == ckpts[1]["size_bytes"]
        assert client.get(f"/v1/actions/{action['id']}").json() == action
    planned = client.post("/v1/plan", json={}).json()["actions"]
    assert {a["state"] for a in planned} == {"pending"}


@pytest.mark.usefixtures("policy")
def test_a_second_sweep_adds_nothing(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 6))
    milestones = make_run(client, "proj", "run-2")
    rolling(client, data_dir, milestones, [10, 20], klass="milestone")
    rolling(client, data_dir, milestones, [30], klass="final")
    end_run(client, milestones["id"], ago(days=2))
    first = sweep_now(client)

    second = sweep_now(client)

    assert len(first["actions"]) == 5
    assert second["actions"] == []
    assert second["id"] != first["id"]
    assert len(ledger(client)) == 5
    keys = open_keys(client)
    assert len(keys) == len(set(keys)) == 5
    assert Counter(k[1] for k in keys) == {"delete": 2, "move": 2, "copy": 1}


@pytest.mark.usefixtures("policy")
def test_sweep_after_execution_adds_nothing_for_done_work(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 6))
    sweep_now(client)
    assert make_executor(app).drain() == 2

    again = sweep_now(client)

    assert again["actions"] == []
    assert {a["state"] for a in ledger(client)} == {"done"}


@pytest.mark.usefixtures("policy")
def test_sweep_of_one_run_or_project(client: TestClient, data_dir: Path) -> None:
    first = make_run(client, "proj-a", "run-1")
    second = make_run(client, "proj-b", "run-1")
    rolling(client, data_dir, first, range(1, 5))
    rolling(client, data_dir, second, range(1, 5))

    by_run = sweep_now(client, run_id=first["id"])
    by_project = sweep_now(client, project="proj-b")

    assert {a["run_id"] for a in ledger(client) if a["id"] in by_run["actions"]} == {first["id"]}
    assert {a["run_id"] for a in ledger(client) if a["id"] in by_project["actions"]} == {
        second["id"]
    }
    assert len(by_run["actions"]) == len(by_project["actions"]) == 1


def test_sweep_of_an_unknown_run_or_project_is_a_404(client: TestClient) -> None:
    assert_problem(client.post("/v1/sweeps", json={"run_id": "run_nothing"}), 404, "run_id")
    assert_problem(client.post("/v1/sweeps", json={"project": "nobody"}), 404, "project")
    assert ledger(client) == []


def test_sweep_without_a_policy_writes_nothing(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 8))

    assert sweep_now(client)["actions"] == []
    assert ledger(client) == []


# --- blast radius -------------------------------------------------------------------------


@pytest.mark.usefixtures("policy")
def test_deletes_beyond_half_by_count_are_held_until_approved(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    ckpts = rolling(client, data_dir, run, range(1, 11))
    disk = tree(data_dir)

    result = sweep_now(client)

    assert len(result["actions"]) == 7
    assert set(states(client, result["actions"])) == {"held"}
    planned = client.post("/v1/plan", json={}).json()["actions"]
    assert sorted((a["step"], a["state"]) for a in planned) == [(s, "held") for s in range(1, 8)]
    worker = make_executor(app)
    assert worker.drain() == 0
    assert tree(data_dir) == disk
    assert {fetch_checkpoint(client, c["id"])["state"] for c in ckpts.values()} == {"active"}
    assert sweep_now(client)["actions"] == []

    one = result["actions"][0]
    approved = client.post(f"/v1/actions/{one}/approve")
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "pending"
    assert worker.drain() == 1
    assert states(client, [one]) == ["done"]
    assert sorted(states(client, result["actions"][1:])) == ["held"] * 6

    rest = client.post(f"/v1/sweeps/{result['id']}/approve")
    assert rest.status_code == 200, rest.text
    assert rest.json()["id"] == result["id"]
    assert sorted(rest.json()["actions"]) == sorted(result["actions"][1:])
    assert worker.drain() == 6
    assert set(states(client, result["actions"])) == {"done"}
    trashed = [
        s for s, c in ckpts.items() if fetch_checkpoint(client, c["id"])["state"] != "active"
    ]
    assert trashed == list(range(1, 8))


@pytest.mark.usefixtures("policy")
def test_approving_is_idempotent(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 11))
    result = sweep_now(client)
    one = result["actions"][0]

    first = client.post(f"/v1/actions/{one}/approve").json()
    second = client.post(f"/v1/actions/{one}/approve").json()
    assert first["state"] == second["state"] == "pending"
    client.post(f"/v1/sweeps/{result['id']}/approve")
    assert client.post(f"/v1/sweeps/{result['id']}/approve").json()["actions"] == []
    assert set(states(client, result["actions"])) == {"pending"}


def test_approving_unknown_ids_is_404(client: TestClient) -> None:
    assert_problem(client.post("/v1/actions/act_nothing/approve"), 404)
    assert_problem(client.post("/v1/sweeps/swp_nothing/approve"), 404)


@pytest.mark.usefixtures("policy")
def test_exactly_half_is_not_held(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 7))

    result = sweep_now(client)

    assert len(result["actions"]) == 3
    assert set(states(client, result["actions"])) == {"pending"}


@pytest.mark.usefixtures("policy")
def test_deletes_beyond_half_by_bytes_are_held(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    big = place_checkpoint(client, data_dir, run, 1, files=step_files(1, n=2, size=4096))
    rolling(client, data_dir, run, range(2, 5))

    result = sweep_now(client)

    assert len(result["actions"]) == 1
    assert client.get(f"/v1/actions/{result['actions'][0]}").json()["checkpoint_id"] == big["id"]
    assert states(client, result["actions"]) == ["held"]


@pytest.mark.usefixtures("policy")
def test_blast_radius_counts_every_run_of_the_project(client: TestClient, data_dir: Path) -> None:
    busy = make_run(client, "proj-a", "run-1")
    rolling(client, data_dir, busy, range(1, 11))
    rolling(client, data_dir, make_run(client, "proj-a", "run-2"), range(1, 4))
    rolling(client, data_dir, make_run(client, "proj-a", "run-3"), range(1, 4))
    alone = make_run(client, "proj-b", "run-1")
    rolling(client, data_dir, alone, range(1, 11))

    result = sweep_now(client)

    actions = [a for a in ledger(client) if a["id"] in result["actions"]]
    # proj-a: 7 deletes of 16 active checkpoints; proj-b: 7 of 10
    assert Counter((a["run_id"], a["state"]) for a in actions) == {
        (busy["id"], "pending"): 7,
        (alone["id"], "held"): 7,
    }


def test_moves_and_copies_are_never_held(client: TestClient, data_dir: Path) -> None:
    put_policy(
        client,
        "name: default\nrules:\n"
        "  - name: drop-rolling\n    class: rolling\n    action: delete\n"
        "  - name: all-cold\n    class: milestone\n    action: {move_to: cold}\n"
        "  - name: finals\n    class: final\n    action: {copy_to: archive}\n",
    )
    moved = make_run(client, "moved", "run-1")
    rolling(client, data_dir, moved, [10, 20, 30], klass="milestone")
    rolling(client, data_dir, moved, [40], klass="final")
    mixed = make_run(client, "mixed", "run-1")
    rolling(client, data_dir, mixed, range(1, 7))
    rolling(client, data_dir, mixed, [10, 20], klass="milestone")
    rolling(client, data_dir, mixed, [40], klass="final")
    for run in (moved, mixed):
        end_run(client, run["id"], ago(days=1))

    result = sweep_now(client)

    actions = [a for a in ledger(client) if a["id"] in result["actions"]]
    assert Counter((a["run_id"], a["kind"], a["state"]) for a in actions) == {
        (moved["id"], "move", "pending"): 3,
        (moved["id"], "copy", "pending"): 1,
        (mixed["id"], "delete", "held"): 6,
        (mixed["id"], "move", "pending"): 2,
        (mixed["id"], "copy", "pending"): 1,
    }


# --- GET /v1/actions: filters and pages -------------------------------------------------


@pytest.fixture
def busy_ledger(client: TestClient, data_dir: Path, policy: None) -> dict[str, Any]:
    """3 rolling deletes in run-1; 2 milestone moves and 1 final copy in run-2."""
    first = make_run(client, "proj", "run-1")
    a = rolling(client, data_dir, first, range(1, 7))
    second = make_run(client, "proj", "run-2")
    rolling(client, data_dir, second, [10, 20], klass="milestone")
    place_checkpoint(client, data_dir, second, 30, "final")
    end_run(client, second["id"], ago(days=2))
    assert len(sweep_now(client)["actions"]) == 6
    return {"first": first, "second": second, "a": a}


def test_actions_filter_by_state_kind_checkpoint_and_run(
    client: TestClient, app: FastAPI, busy_ledger: dict[str, Any]
) -> None:
    assert len(ledger(client)) == 6
    first, second = busy_ledger["first"], busy_ledger["second"]

    assert {a["kind"] for a in ledger(client, kind="delete")} == {"delete"}
    assert len(ledger(client, kind="delete")) == 3
    assert len(ledger(client, kind="move")) == 2
    assert [a["kind"] for a in ledger(client, kind="copy")] == ["copy"]
    assert ledger(client, kind="purge") == []
    assert {a["run_id"] for a in ledger(client, run_id=first["id"])} == {first["id"]}
    assert len(ledger(client, run_id=second["id"])) == 3
    one = ledger(client, checkpoint_id=busy_ledger["a"][2]["id"])
    assert [(a["checkpoint_id"], a["kind"]) for a in one] == [(busy_ledger["a"][2]["id"], "delete")]
    assert len(ledger(client, state="pending")) == 6

    assert make_executor(app).drain() == 6
    assert len(ledger(client, state="done")) == 6
    assert ledger(client, state="pending") == []
    assert ledger(client, state="done", kind="copy", run_id=first["id"]) == []
    assert len(ledger(client, state="done", kind="delete", run_id=first["id"])) == 3


def test_actions_paginate_without_loss_or_repeats(
    client: TestClient, busy_ledger: dict[str, Any]
) -> None:
    everything = ledger(client)

    items, pages = list_all(client, "/v1/actions", 4)
    filtered, filtered_pages = list_all(client, "/v1/actions", 1, kind="delete")

    assert [a["id"] for a in items] == [a["id"] for a in everything]
    assert len({a["id"] for a in items}) == 6
    assert pages == 2
    assert len(filtered) == filtered_pages == 3


@pytest.mark.parametrize(
    ("params", "field"),
    [({"state": "sleeping"}, "state"), ({"kind": "shred"}, "kind"), ({"limit": 0}, "limit")],
)
def test_actions_refuse_bad_filters(client: TestClient, params: dict[str, Any], field: str) -> None:
    assert_problem(client.get("/v1/actions", params=params), 422, field)


def test_unknown_action_is_404(client: TestClient) -> None:
    assert_problem(client.get("/v1/actions/act_nothing"), 404)


# --- registration-triggered evaluation ----------------------------------------------------


@pytest.fixture
def evaluating_app(settings: Settings, clean_engine: Engine) -> FastAPI:
    return create_app(
        settings,
        engine=clean_engine,
        roles=Roles(worker=False, scheduler=False, evaluator=True),
    )


@pytest.fixture
def evaluating_client(evaluating_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(evaluating_app) as client:
        yield client


def test_registration_evaluates_its_run_without_a_sweep(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    client, runtime = evaluating_client, evaluating_app.state.runtime
    put_policy(client, POLICY)
    run = make_run(client)
    ckpts = rolling(client, data_dir, run, range(1, 4))
    assert runtime.wait_idle(timeout=30)
    assert ledger(client) == []

    fourth = place_checkpoint(client, data_dir, run, 4)
    assert fourth["state"] == "active"
    assert runtime.wait_idle(timeout=30)

    actions = ledger(client)
    assert [(a["checkpoint_id"], a["kind"], a["state"]) for a in actions] == [
        (ckpts[1]["id"], "delete", "pending")
    ]
    assert actions[0]["rule"] == "default/rolling-keep-3"
    # nothing executes it in this process: no worker runs, the bytes are still there
    assert tree(step_dir(data_dir, "hot", run, 1))
    assert fetch_checkpoint(client, ckpts[1]["id"])["state"] == "active"


def test_registration_answers_before_its_evaluation_runs(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    client, runtime = evaluating_client, evaluating_app.state.runtime
    put_policy(client, POLICY)
    run = make_run(client)
    ckpts = rolling(client, data_dir, run, range(1, 4))
    assert runtime.wait_idle(timeout=30)

    # Hold the evaluation lock: an evaluation cannot write the ledger until it is released.
    blocker = Session(evaluating_app.state.engine)
    try:
        with evaluation_lock(blocker):
            fourth = place_checkpoint(client, data_dir, run, 4)
            assert fourth["step"] == 4
            assert not runtime.wait_idle(timeout=0.2)  # its evaluation is waiting on the lock
            assert ledger(client) == []
            blocker.rollback()
    finally:
        blocker.close()
    assert runtime.wait_idle(timeout=30)
    assert [(a["checkpoint_id"], a["kind"]) for a in ledger(client)] == [(ckpts[1]["id"], "delete")]


def test_ending_a_run_triggers_its_evaluation(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    client, runtime = evaluating_client, evaluating_app.state.runtime
    put_policy(client, POLICY)
    run = make_run(client)
    final = place_checkpoint(client, data_dir, run, 100, "final")
    assert runtime.wait_idle(timeout=30)
    assert ledger(client) == []

    end_run(client, run["id"], ago(hours=1))
    assert runtime.wait_idle(timeout=30)

    assert [(a["checkpoint_id"], a["kind"], a["to_tier"]) for a in ledger(client)] == [
        (final["id"], "copy", "archive")
    ]


def test_a_run_s_own_evaluation_weighs_its_deletes_against_the_whole_project(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    """The evaluation of one run reads only that run; the project's other runs still count
    towards the blast radius: 7 deletes of one run's 10 are not held in a project of 20."""
    client, runtime = evaluating_client, evaluating_app.state.runtime
    run = make_run(client, "shared")
    rolling(client, data_dir, run, range(1, 10))
    rolling(client, data_dir, make_run(client, "shared", "run-2"), range(1, 11), klass="milestone")
    assert runtime.wait_idle(timeout=30)
    put_policy(client, POLICY)

    place_checkpoint(client, data_dir, run, 10)
    assert runtime.wait_idle(timeout=30)

    assert Counter((a["run_id"], a["kind"], a["state"]) for a in ledger(client)) == {
        (run["id"], "delete", "pending"): 7
    }


def test_registration_triggered_deletes_respect_the_blast_radius(
    evaluating_client: TestClient, evaluating_app: FastAPI, data_dir: Path
) -> None:
    client, runtime = evaluating_client, evaluating_app.state.runtime
    run = make_run(client)
    rolling(client, data_dir, run, range(1, 10))
    assert runtime.wait_idle(timeout=30)
    assert ledger(client) == []
    put_policy(client, POLICY)

    place_checkpoint(client, data_dir, run, 10)
    assert runtime.wait_idle(timeout=30)

    assert Counter((a["kind"], a["state"]) for a in ledger(client)) == {("delete", "held"): 7}
