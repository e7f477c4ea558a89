"""Runs over HTTP: idempotent create, list filters, get, PATCH (status, ended_at, policy,
labels, resumed_from)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import assert_problem, make_checkpoint, make_run, write_checkpoint


def ts(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.tzinfo is not None, f"{value!r} carries no offset"
    return parsed


def run_names(client: TestClient, **params: Any) -> list[str]:
    response = client.get("/v1/runs", params=params)
    assert response.status_code == 200, response.text
    return sorted(f"{r['project']}/{r['name']}" for r in response.json()["items"])


def test_create_answers_201_with_the_new_run(client: TestClient) -> None:
    before = datetime.now(UTC)
    response = client.post(
        "/v1/runs",
        json={"project": "llama", "name": "70b-a", "labels": {"team": "nlp"}, "policy": "keep-3"},
    )
    after = datetime.now(UTC)

    assert response.status_code == 201, response.text
    run = response.json()
    assert run["id"]
    assert run["project"] == "llama"
    assert run["name"] == "70b-a"
    assert run["status"] == "active"
    assert run["labels"] == {"team": "nlp"}
    assert run["policy"] == "keep-3"
    assert run["resumed_from"] is None
    assert run["ended_at"] is None
    assert before <= ts(run["started_at"]) <= after
    assert client.get(f"/v1/runs/{run['id']}").json() == run


def test_same_project_and_name_again_answers_200_with_the_existing_run(
    client: TestClient,
) -> None:
    first = client.post("/v1/runs", json={"project": "llama", "name": "70b-a"})
    assert first.status_code == 201

    again = client.post(
        "/v1/runs", json={"project": "llama", "name": "70b-a", "labels": {"restart": "1"}}
    )

    assert again.status_code == 200, again.text
    assert again.json() == first.json()  # the restarted job gets the run as it was
    assert run_names(client) == ["llama/70b-a"]


def test_the_same_run_name_in_another_project_is_another_run(client: TestClient) -> None:
    a = client.post("/v1/runs", json={"project": "alpha", "name": "run"})
    b = client.post("/v1/runs", json={"project": "beta", "name": "run"})

    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    assert b.json()["project"] == "beta"


def test_list_filters_by_project_and_status(client: TestClient) -> None:
    make_run(client, "alpha", "a1")
    a2 = make_run(client, "alpha", "a2")
    make_run(client, "beta", "b1")
    b2 = make_run(client, "beta", "b2")
    assert client.patch(f"/v1/runs/{a2['id']}", json={"status": "completed"}).status_code == 200
    assert client.patch(f"/v1/runs/{b2['id']}", json={"status": "failed"}).status_code == 200

    assert run_names(client) == ["alpha/a1", "alpha/a2", "beta/b1", "beta/b2"]
    assert run_names(client, project="alpha") == ["alpha/a1", "alpha/a2"]
    assert run_names(client, status="active") == ["alpha/a1", "beta/b1"]
    assert run_names(client, status="completed") == ["alpha/a2"]
    assert run_names(client, project="beta", status="failed") == ["beta/b2"]
    assert run_names(client, project="beta", status="completed") == []
    assert run_names(client, project="gamma") == []


def test_get_unknown_run_is_404_problem(client: TestClient) -> None:
    make_run(client)
    body = assert_problem(client.get("/v1/runs/run_doesnotexist"), 404, "run_id")
    assert "run_doesnotexist" in body["detail"]


def test_patch_unknown_run_is_404_and_creates_nothing(client: TestClient) -> None:
    assert_problem(client.patch("/v1/runs/run_nope", json={"status": "completed"}), 404)
    assert run_names(client) == []


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_ending_a_run_stamps_ended_at_now(client: TestClient, status: str) -> None:
    run = make_run(client)
    before = datetime.now(UTC)
    response = client.patch(f"/v1/runs/{run['id']}", json={"status": status})
    after = datetime.now(UTC)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == status
    assert before <= ts(body["ended_at"]) <= after
    assert client.get(f"/v1/runs/{run['id']}").json() == body


def test_an_explicit_ended_at_is_kept(client: TestClient) -> None:
    run = make_run(client)
    response = client.patch(
        f"/v1/runs/{run['id']}",
        json={"status": "completed", "ended_at": "2026-01-02T05:04:05+02:00"},
    )

    assert response.status_code == 200, response.text
    expected = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert ts(response.json()["ended_at"]) == expected
    # later edits and repeating the status leave the end where the job said it was
    client.patch(f"/v1/runs/{run['id']}", json={"labels": {"k": "v"}})
    client.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
    assert ts(client.get(f"/v1/runs/{run['id']}").json()["ended_at"]) == expected


def test_ended_at_on_an_ended_run_moves_the_end(client: TestClient) -> None:
    run = make_run(client)
    client.patch(f"/v1/runs/{run['id']}", json={"status": "failed"})
    response = client.patch(f"/v1/runs/{run['id']}", json={"ended_at": "2026-03-04T00:00:00Z"})

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "failed"
    assert ts(response.json()["ended_at"]) == datetime(2026, 3, 4, tzinfo=UTC)


def test_reopening_a_run_clears_ended_at(client: TestClient) -> None:
    run = make_run(client)
    client.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
    response = client.patch(f"/v1/runs/{run['id']}", json={"status": "active"})

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "active"
    assert response.json()["ended_at"] is None


@pytest.mark.parametrize(
    ("start_status", "patch"),
    [
        ("active", {"ended_at": "2026-01-01T00:00:00Z"}),
        ("completed", {"status": "active", "ended_at": "2026-01-01T00:00:00Z"}),
    ],
)
def test_ended_at_on_an_active_run_is_422_and_changes_nothing(
    client: TestClient, start_status: str, patch: dict[str, Any]
) -> None:
    run = make_run(client)
    if start_status != "active":
        client.patch(f"/v1/runs/{run['id']}", json={"status": start_status})
    before = client.get(f"/v1/runs/{run['id']}").json()

    assert_problem(
        client.patch(f"/v1/runs/{run['id']}", json={**patch, "labels": {"x": "y"}}),
        422,
        "ended_at",
    )
    assert client.get(f"/v1/runs/{run['id']}").json() == before


def test_policy_null_clears_the_policy_and_absent_keeps_it(client: TestClient) -> None:
    run = make_run(client, policy="keep-3")

    kept = client.patch(f"/v1/runs/{run['id']}", json={"labels": {"a": "b"}})
    assert kept.json()["policy"] == "keep-3"
    changed = client.patch(f"/v1/runs/{run['id']}", json={"policy": "milestones"})
    assert changed.json()["policy"] == "milestones"
    cleared = client.patch(f"/v1/runs/{run['id']}", json={"policy": None})

    assert cleared.status_code == 200, cleared.text
    assert cleared.json()["policy"] is None
    assert client.get(f"/v1/runs/{run['id']}").json()["policy"] is None


def test_labels_are_replaced_not_merged(client: TestClient) -> None:
    run = make_run(client, labels={"team": "nlp", "tier": "gold"})

    response = client.patch(f"/v1/runs/{run['id']}", json={"labels": {"owner": "ana"}})

    assert response.status_code == 200, response.text
    assert response.json()["labels"] == {"owner": "ana"}
    assert client.get(f"/v1/runs/{run['id']}").json()["labels"] == {"owner": "ana"}
    emptied = client.patch(f"/v1/runs/{run['id']}", json={"labels": {}})
    assert emptied.json()["labels"] == {}


@pytest.mark.parametrize("patch", [{"status": None}, {"labels": None}])
def test_null_for_a_required_value_is_422_and_nothing_else_applies(
    client: TestClient, patch: dict[str, Any]
) -> None:
    run = make_run(client, labels={"a": "1"}, policy="keep-3")
    field = next(iter(patch))
    body = {"policy": "other", **({"labels": {"b": "2"}} if field != "labels" else {}), **patch}

    assert_problem(client.patch(f"/v1/runs/{run['id']}", json=body), 422, field)
    after = client.get(f"/v1/runs/{run['id']}").json()
    assert (after["labels"], after["policy"], after["status"]) == ({"a": "1"}, "keep-3", "active")


def test_resumed_from_must_name_an_existing_checkpoint(client: TestClient, data_dir: Path) -> None:
    first = make_run(client, name="attempt-1")
    uri = write_checkpoint(data_dir / "hot", "proj/attempt-1/step-500")
    checkpoint = make_checkpoint(client, first["id"], 500, uri)

    refused = client.post(
        "/v1/runs", json={"project": "proj", "name": "attempt-2", "resumed_from": "ckpt_missing"}
    )
    assert_problem(refused, 404, "resumed_from")
    assert run_names(client) == ["proj/attempt-1"]

    second = client.post(
        "/v1/runs", json={"project": "proj", "name": "attempt-2", "resumed_from": checkpoint["id"]}
    )
    assert second.status_code == 201, second.text
    assert second.json()["resumed_from"] == checkpoint["id"]


def test_patch_resumed_from_is_checked_and_can_be_cleared(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-1")
    checkpoint = make_checkpoint(client, run["id"], 1, uri)

    assert_problem(
        client.patch(f"/v1/runs/{run['id']}", json={"resumed_from": "ckpt_missing"}),
        404,
        "resumed_from",
    )
    assert client.get(f"/v1/runs/{run['id']}").json()["resumed_from"] is None

    set_ = client.patch(f"/v1/runs/{run['id']}", json={"resumed_from": checkpoint["id"]})
    assert set_.status_code == 200, set_.text
    assert set_.json()["resumed_from"] == checkpoint["id"]
    cleared = client.patch(f"/v1/runs/{run['id']}", json={"resumed_from": None})
    assert cleared.json()["resumed_from"] is None


def test_an_empty_patch_changes_nothing(client: TestClient) -> None:
    run = make_run(client, labels={"a": "1"}, policy="keep-3")

    response = client.patch(f"/v1/runs/{run['id']}", json={})

    assert response.status_code == 200, response.text
    assert response.json() == run


# --- adopted runs, ends before starts, label filters, unknown parameters ---------------------


def test_an_adopted_run_keeps_the_start_it_was_given(client: TestClient) -> None:
    response = client.post(
        "/v1/runs",
        json={"project": "llama", "name": "old", "started_at": "2025-06-01T10:00:00+02:00"},
    )

    assert response.status_code == 201, response.text
    assert ts(response.json()["started_at"]) == datetime(2025, 6, 1, 8, tzinfo=UTC)
    again = client.post("/v1/runs", json={"project": "llama", "name": "old"})
    assert again.status_code == 200 and again.json()["started_at"] == response.json()["started_at"]


@pytest.mark.parametrize("started_at", ["yesterday", 1700000000, ""])
def test_a_start_that_is_no_timestamp_is_422(client: TestClient, started_at: object) -> None:
    response = client.post(
        "/v1/runs", json={"project": "llama", "name": "old", "started_at": started_at}
    )

    assert_problem(response, 422, "started_at")
    assert run_names(client) == []


def test_an_end_before_the_start_is_422_and_changes_nothing(client: TestClient) -> None:
    run = make_run(client, started_at="2026-02-01T00:00:00Z")

    response = client.patch(
        f"/v1/runs/{run['id']}", json={"status": "completed", "ended_at": "2026-01-31T23:59:59Z"}
    )

    body = assert_problem(response, 422, "ended_at")
    assert "2026-02-01" in body["detail"]
    assert client.get(f"/v1/runs/{run['id']}").json() == run
    at_the_start = {"status": "completed", "ended_at": "2026-02-01T00:00:00Z"}
    assert client.patch(f"/v1/runs/{run['id']}", json=at_the_start).status_code == 200


def test_ending_a_run_that_starts_ahead_of_the_clock_ends_it_at_its_start(
    client: TestClient,
) -> None:
    run = make_run(client, started_at="2999-01-01T00:00:00Z")

    response = client.patch(f"/v1/runs/{run['id']}", json={"status": "failed"})

    assert response.status_code == 200, response.text
    assert response.json()["ended_at"] == run["started_at"]


def test_list_filters_by_every_label_given(client: TestClient) -> None:
    make_run(client, "alpha", "a1", labels={"team": "nlp", "size": "7b"})
    make_run(client, "alpha", "a2", labels={"team": "nlp", "size": "70b"})
    make_run(client, "beta", "b1", labels={"team": "vision", "size": "7b"})
    make_run(client, "beta", "b2", labels={"note": "team:nlp"})

    assert run_names(client, label="team:nlp") == ["alpha/a1", "alpha/a2"]
    assert run_names(client, label=["team:nlp", "size:7b"]) == ["alpha/a1"]
    assert run_names(client, label=["size:7b"], project="beta") == ["beta/b1"]
    assert run_names(client, label="note:team:nlp") == ["beta/b2"]  # the value may hold ':'
    assert run_names(client, label="team:") == []
    assert run_names(client, label="missing:x") == []


@pytest.mark.parametrize("label", ["team", ":nlp", 'te"am:nlp'])
def test_a_label_filter_without_key_and_value_is_422(client: TestClient, label: str) -> None:
    assert_problem(client.get("/v1/runs", params={"label": label}), 422, "label")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/runs", {"projct": "gpt"}),
        ("/v1/runs", {"project": "gpt", "limit": 5, "statuss": "active"}),
        ("/v1/actions", {"run": "x"}),
        ("/healthz", {"verbose": "1"}),
        ("/v1/tiers", {"cursor": "", "page": "2"}),
    ],
)
def test_an_unknown_query_parameter_is_422_naming_it(
    client: TestClient, path: str, params: dict[str, Any]
) -> None:
    make_run(client, "gpt", "a")
    make_run(client, "other", "b")
    (unknown,) = [name for name in params if name not in ("project", "limit", "cursor")]

    body = assert_problem(client.get(path, params=params), 422, unknown)

    assert body["field"] == unknown


def test_a_patch_accepts_null_wherever_the_document_allows_it(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    fields = document["components"]["schemas"]["RunUpdate"]["properties"]
    nullable = {
        name
        for name, schema in fields.items()
        if any(branch.get("type") == "null" for branch in schema.get("anyOf", []))
    }
    assert nullable == {"policy", "resumed_from", "ended_at"}
    run = make_run(client)

    for name in sorted(nullable):
        response = client.patch(f"/v1/runs/{run['id']}", json={name: None})
        assert response.status_code == 200, (name, response.text)
    for name in sorted(set(fields) - nullable):
        assert_problem(client.patch(f"/v1/runs/{run['id']}", json={name: None}), 422, name)
