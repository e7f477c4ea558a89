"""The OpenAPI document at /openapi.json is whole: every route, every $ref resolvable,
including bodies the app parses itself."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient


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
