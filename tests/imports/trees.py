"""Trees of checkpoints as the frameworks (or a person) leave them, built by the tests,
and helpers to import one and wait for it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.storage.base import Storage

Tree = dict[str, bytes]  # relative key -> content


def hf_tree(run: str, steps: Iterable[int], *, evals: bool = True) -> Tree:
    """A Trainer's output: `checkpoint-<N>/` with weights and trainer_state.json."""
    tree: Tree = {}
    steps = list(steps)
    history: list[dict[str, Any]] = []
    for step in steps:
        history.append({"step": step, "loss": 1.0 / step})
        if evals:
            history.append({"step": step, "eval_loss": 2.0 / step})
        # Python's json (the Trainer's) writes NaN, which strict JSON parsers refuse: the
        # best metric of a run that diverged, here in every other checkpoint's state
        best = float("nan") if step % 200 == 0 else None
        state = {"global_step": step, "best_metric": best, "log_history": list(history)}
        base = f"{run}/checkpoint-{step}"
        tree[f"{base}/model.safetensors"] = b"w" * (100 + step)
        tree[f"{base}/optimizer.pt"] = b"o" * 200
        tree[f"{base}/trainer_state.json"] = json.dumps(state).encode()
    return tree


def megatron_tree(run: str, steps: Iterable[int]) -> Tree:
    tree: Tree = {f"{run}/latest_checkpointed_iteration.txt": b"0"}
    for step in steps:
        base = f"{run}/iter_{step:07d}"
        for rank in range(2):
            tree[f"{base}/mp_rank_0{rank}/model_optim_rng.pt"] = b"m" * (50 + rank)
    return tree


def deepspeed_tree(run: str, steps: Iterable[int]) -> Tree:
    tree: Tree = {}
    for step in steps:
        base = f"{run}/global_step{step}"
        tree[f"{base}/mp_rank_00_model_states.pt"] = b"d" * 70
        tree[f"{base}/zero_pp_rank_0_mp_rank_00_optim_states.pt"] = b"z" * 90
    tree[f"{run}/latest"] = b"global_step"
    return tree


def generic_tree(run: str, steps: Iterable[int], *, dash: bool = True) -> Tree:
    tree: Tree = {}
    for step in steps:
        base = f"{run}/step-{step}" if dash else f"{run}/step_{step}"
        tree[f"{base}/weights.bin"] = b"g" * 40
        tree[f"{base}/meta.json"] = b"{}"
    return tree


def write_local(root: Path, tree: Tree, *, mtime: float | None = None) -> None:
    for key, content in tree.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if mtime is not None:
            os.utime(path, (mtime, mtime))


def upload(storage: Storage, prefix: str, tree: Tree) -> None:
    import io

    for key, content in tree.items():
        storage.upload(f"{prefix}/{key}" if prefix else key, io.BytesIO(content), len(content))


def start_import(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/imports", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


def finished(
    app: FastAPI, client: TestClient, import_id: str, timeout: float = 60
) -> dict[str, Any]:
    """The import once its thread is done (and its record says so)."""
    assert app.state.runtime.imports.wait(timeout)
    deadline = time.monotonic() + timeout
    while True:
        answer: dict[str, Any] = client.get(f"/v1/imports/{import_id}").json()
        if answer["state"] != "running" or time.monotonic() > deadline:
            return answer
        app.state.runtime.imports.wait(1)


def run_import(app: FastAPI, client: TestClient, **body: Any) -> dict[str, Any]:
    started = start_import(client, **body)
    return finished(app, client, started["id"])


def all_items(client: TestClient, import_id: str, limit: int = 1000) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/v1/imports/{import_id}", params=params).json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def catalog(client: TestClient, project: str) -> dict[tuple[str, int], dict[str, Any]]:
    """(run name, step) -> checkpoint, over every run of the project."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    runs = client.get("/v1/runs", params={"project": project, "limit": 1000}).json()["items"]
    for run in runs:
        page = client.get(f"/v1/runs/{run['id']}/checkpoints", params={"limit": 1000}).json()
        for checkpoint in page["items"]:
            found[(run["name"], checkpoint["step"])] = checkpoint
    return found


def stamp(year: int, month: int, day: int) -> float:
    return datetime(year, month, day, tzinfo=UTC).timestamp()
