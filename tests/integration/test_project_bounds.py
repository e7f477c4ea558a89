"""A `read` or `register` token's projects bound what it sees (lists are filtered) and
what it touches; admin and `*` tokens see everything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.builders import (
    assert_problem,
    issue_token,
    list_all,
    place_checkpoint,
    token_client,
)

POLICY = {
    "name": "bounds",
    "rules": [{"name": "keep-1", "class": "rolling", "keep_last": 1, "action": "delete"}],
}


@dataclass
class Catalog:
    runs: dict[str, dict[str, Any]]  # project -> run
    checkpoints: dict[str, list[dict[str, Any]]]  # project -> checkpoints


@pytest.fixture
def catalog(auth_app: FastAPI, admin_client: TestClient, data_dir: Path) -> Catalog:
    """Projects `mine` and `theirs`: a run each with three checkpoints, swept once, so
    each has actions in the ledger."""
    assert admin_client.put("/v1/policies/bounds", json=POLICY).status_code == 200
    runs, checkpoints = {}, {}
    for project in ("mine", "theirs"):
        run = admin_client.post("/v1/runs", json={"project": project, "name": "run"}).json()
        runs[project] = run
        checkpoints[project] = [place_checkpoint(admin_client, data_dir, run, s) for s in (1, 2, 3)]
    assert admin_client.post("/v1/sweeps", json={}).status_code == 202
    return Catalog(runs, checkpoints)


def client_for(app: FastAPI, scope: str, *projects: str) -> TestClient:
    return token_client(app, issue_token(app, name=scope, scopes=(scope,), projects=projects)[1])


@pytest.mark.parametrize("scope", ["read", "register"])
def test_lists_show_a_bounded_token_only_its_projects(
    auth_app: FastAPI, catalog: Catalog, scope: str
) -> None:
    client = client_for(auth_app, scope, "mine")
    runs, _ = list_all(client, "/v1/runs", 1)
    assert [r["project"] for r in runs] == ["mine"]
    assert list_all(client, "/v1/runs", 10, project="theirs")[0] == []
    actions, _ = list_all(client, "/v1/actions", 1)
    assert actions and {a["run_id"] for a in actions} == {catalog.runs["mine"]["id"]}
    theirs = {"run_id": catalog.runs["theirs"]["id"]}
    assert list_all(client, "/v1/actions", 10, **theirs)[0] == []


def test_tier_usage_counts_only_the_token_s_projects(
    auth_app: FastAPI, admin_client: TestClient, catalog: Catalog
) -> None:
    everything = admin_client.get("/v1/tiers").json()["items"]
    mine = client_for(auth_app, "read", "mine").get("/v1/tiers").json()["items"]
    hot_all = next(t["usage"] for t in everything if t["name"] == "hot")
    hot_mine = next(t["usage"] for t in mine if t["name"] == "hot")
    assert hot_all["checkpoints"] == 6
    assert hot_mine["checkpoints"] == 3
    assert hot_mine["bytes"] == sum(c["size_bytes"] for c in catalog.checkpoints["mine"])


def test_a_plan_of_the_whole_catalog_covers_only_the_token_s_projects(
    auth_app: FastAPI, catalog: Catalog
) -> None:
    client = client_for(auth_app, "read", "mine")
    response = client.post("/v1/plan", json={})
    assert response.status_code == 200, response.text
    plan = response.json()
    mine = {c["id"] for c in catalog.checkpoints["mine"]}
    seen = {a["checkpoint_id"] for a in plan["actions"]} | {
        k["checkpoint_id"] for k in plan["kept"]
    }
    assert seen and seen <= mine
    assert_problem(client.post("/v1/plan", json={"project": "theirs"}), 403)
    assert_problem(client.post("/v1/plan", json={"run_id": catalog.runs["theirs"]["id"]}), 403)
    assert client.post("/v1/plan", json={"run_id": catalog.runs["mine"]["id"]}).status_code == 200


def test_every_project_token_and_admin_see_everything(
    auth_app: FastAPI, admin_client: TestClient, catalog: Catalog
) -> None:
    for client in (client_for(auth_app, "read", "*"), admin_client):
        runs, _ = list_all(client, "/v1/runs", 10)
        assert sorted(r["project"] for r in runs) == ["mine", "theirs"]
        theirs = catalog.checkpoints["theirs"][0]["id"]
        assert client.get(f"/v1/checkpoints/{theirs}").status_code == 200


def test_a_register_token_touches_only_its_projects(
    auth_app: FastAPI, catalog: Catalog, data_dir: Path
) -> None:
    client = client_for(auth_app, "register", "mine")
    created = client.post("/v1/runs", json={"project": "mine", "name": "job-2"})
    assert created.status_code == 201, created.text
    assert_problem(client.post("/v1/runs", json={"project": "theirs", "name": "job-2"}), 403)
    assert_problem(client.post("/v1/runs", json={"project": "newcomer", "name": "job"}), 403)
    theirs = catalog.runs["theirs"]
    assert_problem(client.patch(f"/v1/runs/{theirs['id']}", json={"status": "failed"}), 403)
    step = data_dir / "hot" / "theirs" / "run" / "step-9"
    body = {"step": 9, "class": "rolling", "uri": f"file://{step}", "committed": False}
    assert_problem(client.post(f"/v1/runs/{theirs['id']}/checkpoints", json=body), 403)
    commit = f"/v1/checkpoints/{catalog.checkpoints['theirs'][0]['id']}/commit"
    assert_problem(client.post(commit, json={}), 403)
    ended = client.patch(f"/v1/runs/{catalog.runs['mine']['id']}", json={"status": "completed"})
    assert ended.status_code == 200, ended.text


def test_resumed_from_cannot_reach_into_another_project(
    auth_app: FastAPI, admin_client: TestClient, catalog: Catalog
) -> None:
    """`resumed_from` protects a checkpoint from every policy: a bounded token must not
    protect (nor learn of) checkpoints outside its projects."""
    client = client_for(auth_app, "register", "mine")
    theirs = catalog.checkpoints["theirs"][0]["id"]
    body = {"project": "mine", "name": "resumed", "resumed_from": theirs}
    assert_problem(client.post("/v1/runs", json=body), 404, "resumed_from")
    run_id = catalog.runs["mine"]["id"]
    patch = client.patch(f"/v1/runs/{run_id}", json={"resumed_from": theirs})
    assert_problem(patch, 404, "resumed_from")
    mine = catalog.checkpoints["mine"][0]["id"]
    ok = client.post("/v1/runs", json={**body, "resumed_from": mine})
    assert ok.status_code == 201, ok.text
    assert admin_client.post("/v1/runs", json={**body, "name": "x"}).status_code == 201


def test_unknown_ids_are_404_for_a_bounded_token(auth_app: FastAPI, catalog: Catalog) -> None:
    client = client_for(auth_app, "read", "mine")
    assert_problem(client.get("/v1/runs/run_nothing"), 404)
    assert_problem(client.get("/v1/checkpoints/ckpt_nothing"), 404)
    assert_problem(client.get("/v1/actions/act_nothing"), 404)
    assert_problem(client.get("/v1/runs/run_%00"), 404)


def test_metrics_are_for_tokens_bounded_by_no_project(
    auth_app: FastAPI, admin_client: TestClient, catalog: Catalog
) -> None:
    """The counters are the whole service's (every project's actions, every tier's bytes):
    operational figures, not one project's data, so a bounded token cannot read them."""
    bounded = client_for(auth_app, "read", "mine")
    refused = assert_problem(bounded.get("/metrics"), 403)
    assert "every project" in refused["detail"] and '["*"]' in refused["detail"]

    for reader in (client_for(auth_app, "read", "*"), admin_client):
        response = reader.get("/metrics")
        assert response.status_code == 200, response.text
        assert "ckpt_tier_bytes" in response.text
