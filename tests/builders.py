"""Plain typed builders for tests: runs through the API, checkpoint files on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
