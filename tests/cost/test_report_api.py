"""GET /v1/reports/cost on a real catalog (SQLite and PostgreSQL): bytes, checkpoints and USD
a month by tier, project, run and class; trashed checkpoints still billed, replicas billed on
their own tier, deleted and unwritten ones not; a bounded token sees its projects only."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.settings import Settings
from tests.builders import (
    assert_problem,
    issue_token,
    make_executor,
    make_run,
    place_checkpoint,
    step_dir,
    token_client,
)
from tests.cost.conftest import TIER_PRICES, cost_app

GB = 1e9


def usd(size: int, tier: str) -> float:
    return size / GB * TIER_PRICES[tier]


def report(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/reports/cost", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def rows(body: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    return {r["key"]: (r["bytes"], r["checkpoints"], r["trashed_bytes"]) for r in body["rows"]}


@pytest.fixture
def catalog(cost_client: TestClient, priced_app: FastAPI, data_dir: Path) -> dict[str, Any]:
    """proj-a: a rolling checkpoint on hot (1,000 bytes, then trashed) and a milestone on
    cold (2,000). proj-b: a rolling checkpoint on hot (500) with a replica on archive."""
    a = make_run(cost_client, "proj-a", "run-1")
    b = make_run(cost_client, "proj-b", "run-1")
    a1 = place_checkpoint(cost_client, data_dir, a, 1, files={"w": b"x" * 1000})
    place_checkpoint(
        cost_client, data_dir, a, 2, "milestone", tier="cold", files={"w": b"y" * 2000}
    )
    b1 = place_checkpoint(cost_client, data_dir, b, 1, files={"w": b"z" * 500})
    assert cost_client.delete(f"/v1/checkpoints/{a1['id']}").status_code == 202
    response = cost_client.post(f"/v1/checkpoints/{b1['id']}/restore", json={"tier": "archive"})
    assert response.status_code == 202, response.text
    make_executor(priced_app).drain()
    return {"a": a, "b": b}


def test_by_tier_every_tier_hottest_first(cost_client: TestClient, catalog: dict[str, Any]) -> None:
    body = report(cost_client, group_by="tier")

    assert [r["key"] for r in body["rows"]] == ["hot", "warm", "cold", "archive"]
    assert rows(body) == {
        "hot": (1500, 2, 1000),  # the trashed checkpoint is still billed
        "warm": (0, 0, 0),
        "cold": (2000, 1, 0),
        "archive": (500, 1, 0),  # the replica, billed on its own tier
    }
    by_key = {r["key"]: r["usd_month"] for r in body["rows"]}
    assert by_key["hot"] == pytest.approx(usd(1500, "hot"), rel=1e-12)
    assert by_key["cold"] == pytest.approx(usd(2000, "cold"), rel=1e-12)
    assert body["total_bytes"] == 4000
    assert body["total_usd_month"] == pytest.approx(
        usd(1500, "hot") + usd(2000, "cold") + usd(500, "archive"), rel=1e-12
    )
    assert body["prices"]["hot"]["storage_gb_month"] == 0.023


def test_by_project_run_and_class(cost_client: TestClient, catalog: dict[str, Any]) -> None:
    by_project = report(cost_client, group_by="project")
    assert rows(by_project) == {"proj-a": (3000, 2, 1000), "proj-b": (1000, 1, 0)}
    a_usd = usd(1000, "hot") + usd(2000, "cold")
    b_usd = usd(500, "hot") + usd(500, "archive")
    assert [r["key"] for r in by_project["rows"]] == ["proj-a", "proj-b"]  # costliest first
    assert by_project["rows"][0]["usd_month"] == pytest.approx(a_usd, rel=1e-12)

    by_run = report(cost_client, group_by="run")
    assert rows(by_run) == {catalog["a"]["id"]: (3000, 2, 1000), catalog["b"]["id"]: (1000, 1, 0)}
    assert {r["name"] for r in by_run["rows"]} == {"proj-a/run-1", "proj-b/run-1"}

    by_class = report(cost_client, group_by="class")
    assert rows(by_class) == {"rolling": (2000, 2, 1000), "milestone": (2000, 1, 0)}

    totals = {g["total_usd_month"] for g in (by_project, by_run, by_class)}
    assert all(t == pytest.approx(a_usd + b_usd, rel=1e-12) for t in totals)


def test_one_project(cost_client: TestClient, catalog: dict[str, Any]) -> None:
    body = report(cost_client, group_by="class", project="proj-b")
    assert rows(body) == {"rolling": (1000, 1, 0)}


def test_unwritten_and_purged_checkpoints_cost_nothing(
    cost_client: TestClient, priced_app: FastAPI, data_dir: Path
) -> None:
    run = make_run(cost_client, "proj", "run-1")
    gone = place_checkpoint(cost_client, data_dir, run, 1, files={"w": b"x" * 700})
    reserved = step_dir(data_dir, "hot", run, 2)
    response = cost_client.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={"step": 2, "class": "rolling", "uri": f"file://{reserved}", "committed": False},
    )
    assert response.status_code == 201, response.text
    assert cost_client.delete(f"/v1/checkpoints/{gone['id']}").status_code == 202
    make_executor(priced_app, trash_retention=timedelta(0)).drain()
    make_executor(priced_app, trash_retention=timedelta(0)).drain()  # the purge it enqueued

    assert cost_client.get(f"/v1/checkpoints/{gone['id']}").json()["state"] == "deleted"
    body = report(cost_client, group_by="project")
    assert body["rows"] == [] and body["total_usd_month"] == 0.0


def test_a_bad_grouping_or_project_is_a_problem(cost_client: TestClient) -> None:
    assert_problem(
        cost_client.get("/v1/reports/cost", params={"group_by": "color"}), 422, "group_by"
    )
    assert_problem(
        cost_client.get("/v1/reports/cost", params={"project": "Bad Name"}), 422, "project"
    )


def test_a_bounded_token_sees_its_projects_only(
    priced_settings: Settings, clean_engine: Engine, data_dir: Path
) -> None:
    app = cost_app(priced_settings.model_copy(update={"auth": "on"}), clean_engine)
    with TestClient(app):
        admin = token_client(app, issue_token(app, name="admin", scopes=("admin",))[1])
        for project in ("proj-a", "proj-b"):
            place_checkpoint(admin, data_dir, make_run(admin, project, "run-1"), 1)
        reader = token_client(
            app, issue_token(app, name="reader", scopes=("read",), projects=("proj-a",))[1]
        )

        assert set(rows(report(reader, group_by="project"))) == {"proj-a"}
        assert rows(report(reader, group_by="project", project="proj-b")) == {}
        assert set(rows(report(admin, group_by="project"))) == {"proj-a", "proj-b"}
        assert token_client(app, None).get("/v1/reports/cost").status_code == 401
