"""Plain typed builders for tests: runs through the API, checkpoint files on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient


def make_run(
    client: TestClient, project: str = "proj", name: str = "run-1", **extra: Any
) -> dict[str, Any]:
    response = client.post("/v1/runs", json={"project": project, "name": name, **extra})
    assert response.status_code in (200, 201), response.text
    body: dict[str, Any] = response.json()
    return body


def write_checkpoint(tier_dir: Path, relative: str, files: dict[str, bytes] | None = None) -> str:
    """Write files under `tier_dir/relative` and return its file:// uri."""
    root = tier_dir / relative
    for path, content in (files or {"model.pt": b"weights", "optim/state.pt": b"moments!"}).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return f"file://{root.resolve()}"


def manifest(n: int, size: int = 1000) -> list[dict[str, Any]]:
    return [{"path": f"shard-{i:05d}.safetensors", "size_bytes": size} for i in range(n)]


PROBLEM_JSON = "application/problem+json"


def register(
    client: TestClient | httpx.Client,
    run_id: str,
    step: int,
    uri: str,
    klass: str = "rolling",
    **extra: Any,
) -> httpx.Response:
    """POST a checkpoint registration and return the raw response."""
    body = {"step": step, "class": klass, "uri": uri, **extra}
    return client.post(f"/v1/runs/{run_id}/checkpoints", json=body)


def make_checkpoint(
    client: TestClient, run_id: str, step: int, uri: str, klass: str = "rolling", **extra: Any
) -> dict[str, Any]:
    """Register a checkpoint that must be accepted as new (201) and return it."""
    response = register(client, run_id, step, uri, klass, **extra)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def names_field(reported: str, field: str) -> bool:
    """`reported` is `field` itself or a part of it (`files[0].path` names `files`)."""
    return reported == field or reported.startswith((f"{field}.", f"{field}["))


def assert_problem(
    response: httpx.Response, status: int, field: str | None = None
) -> dict[str, Any]:
    """An RFC 9457 problem answer with `status`; when `field` is given, the answer names it
    both in `field` and in the human-readable `detail`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == PROBLEM_JSON, response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status, body
    assert body["title"] and body["detail"], body
    if field is not None:
        assert names_field(str(body.get("field")), field), body
        assert field in body["detail"], body
    return body


def list_all(
    client: TestClient | httpx.Client, path: str, limit: int, **params: Any
) -> tuple[list[dict[str, Any]], int]:
    """Follow `next_cursor` to the end; returns every item and the number of pages.
    Every page but the last is full, and only the last has no cursor."""
    items: list[dict[str, Any]] = []
    pages = 0
    cursor: str | None = None
    while True:
        query = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        response = client.get(path, params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        pages += 1
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            assert len(page["items"]) <= limit
            return items, pages
        assert len(page["items"]) == limit, page
        assert pages < 10_000, "the cursor never ends"
