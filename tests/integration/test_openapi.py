"""The OpenAPI document at /openapi.json is whole: every route, every $ref resolvable,
including bodies the app parses itself."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import assert_problem


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_reference_resolves(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    missing = {ref for ref in _refs(document) if ref.split("/")[-1] not in schemas}
    assert missing == set()


def test_registration_body_is_documented(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    operation = document["paths"]["/v1/runs/{run_id}/checkpoints"]["post"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = document["components"]["schemas"][ref.split("/")[-1]]
    assert {"step", "class", "uri", "files", "committed"} <= set(body["properties"])
    assert set(body["required"]) == {"step", "class", "uri"}


def test_bearer_tokens_are_documented(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert document["paths"]["/v1/tokens"]["post"]["x-required-scope"] == "admin"
    assert document["paths"]["/v1/runs"]["get"]["x-required-scope"] == "read"


def test_every_error_is_documented_as_a_problem_document(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["Problem"]["required"]) == {"type", "title", "status", "detail"}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            errors = {s: r for s, r in operation["responses"].items() if s.startswith(("4", "5"))}
            assert "422" in errors, (method, path)  # an unknown query parameter, everywhere
            for status, response in errors.items():
                assert list(response["content"]) == ["application/problem+json"], (path, status)
            if "{" in path:
                assert "404" in errors, (method, path)
            if operation.get("x-required-scope"):
                assert {"401", "403"} <= set(errors), (method, path)


@pytest.mark.parametrize(
    ("path", "statuses"),
    [
        ("DELETE /v1/checkpoints/{checkpoint_id}", {"202", "401", "403", "404", "409", "422"}),
        (
            "POST /v1/checkpoints/{checkpoint_id}/keepalive",
            {"200", "401", "403", "404", "409", "422"},
        ),
        (
            "POST /v1/checkpoints/{checkpoint_id}/abort",
            {"200", "400", "401", "403", "404", "409", "415", "422"},
        ),
        (
            "PATCH /v1/checkpoints/{checkpoint_id}",
            {"200", "400", "401", "403", "404", "409", "415", "422"},
        ),
        ("POST /v1/plan", {"200", "400", "401", "403", "404", "415", "422"}),
        ("GET /v1/runs", {"200", "400", "401", "403", "422"}),
        ("GET /healthz", {"200", "422"}),
    ],
)
def test_an_operation_documents_the_statuses_it_answers(
    client: TestClient, path: str, statuses: set[str]
) -> None:
    method, template = path.split(" ")
    operation = client.get("/openapi.json").json()["paths"][template][method.lower()]

    assert set(operation["responses"]) == statuses


def test_a_405_allows_every_method_of_the_path(client: TestClient) -> None:
    for path, allowed in (
        ("/v1/runs", "GET, POST"),
        ("/v1/checkpoints/ckpt_x", "DELETE, GET, PATCH"),
        ("/v1/runs/run_x", "GET, PATCH"),
        ("/v1/checkpoints/ckpt_x/pin", "DELETE, POST"),
    ):
        response = client.put(path, json={})
        assert_problem(response, 405)
        assert response.headers["allow"] == allowed, path


def test_the_document_names_what_the_app_knows(client: TestClient, data_dir: Any) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    tiers = ["hot", "warm", "cold", "archive"]
    assert schemas["RestoreRequest"]["properties"]["tier"]["enum"] == tiers
    assert schemas["policy.MoveTo"]["properties"]["move_to"]["enum"] == tiers
    uri = schemas["CheckpointCreate"]["properties"]["uri"]["pattern"]
    assert str(data_dir.resolve() / "hot") in uri.replace("\\", "")


def test_the_reservation_and_update_routes_are_documented(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths, schemas = document["paths"], document["components"]["schemas"]
    for verb in ("keepalive", "abort", "commit"):
        operation = paths[f"/v1/checkpoints/{{checkpoint_id}}/{verb}"]["post"]
        assert operation["x-required-scope"] == "register", verb
    assert paths["/v1/checkpoints/{checkpoint_id}"]["patch"]["x-required-scope"] == "register"
    assert "reserved_until" in schemas["CheckpointRead"]["properties"]
    assert set(schemas["CheckpointUpdate"]["properties"]) == {"class", "labels", "metrics"}
    assert schemas["CheckpointUpdate"].get("additionalProperties") is False
    assert set(schemas["AbortRequest"]["properties"]) == {"reason"}
