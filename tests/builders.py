"""Plain typed builders for tests: runs through the API, checkpoint files on disk."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db.session import session_scope
from app.services.catalog.tokens import create_token
from app.services.lifecycle.worker import Worker
from app.settings import Settings

# Runs start here unless a test says otherwise, so that a test may end one on any later
# date it likes (a run cannot end before it started).
RUNS_START = "2020-01-01T00:00:00Z"


def make_run(
    client: TestClient, project: str = "proj", name: str = "run-1", **extra: Any
) -> dict[str, Any]:
    body = {"project": project, "name": name, "started_at": RUNS_START, **extra}
    response = client.post("/v1/runs", json=body)
    assert response.status_code in (200, 201), response.text
    created: dict[str, Any] = response.json()
    return created


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
    created: dict[str, Any] = response.json()
    return created


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


# --- lifecycle: checkpoints on the local tiers, the ledger, the worker ---------------------


def iso(moment: datetime) -> str:
    """An ISO 8601 UTC timestamp as the API takes it."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def step_files(step: int, n: int = 2, size: int = 64) -> dict[str, bytes]:
    """`n` small files whose bytes differ from step to step (a copy of the wrong step shows)."""
    return {f"shard-{i}.bin": (f"step {step} shard {i};".encode() * size)[:size] for i in range(n)}


def file_entries(files: dict[str, bytes], *, checksums: bool = True) -> list[dict[str, Any]]:
    """The manifest of `files`, with sha256 checksums unless told otherwise."""
    return [
        {
            "path": path,
            "size_bytes": len(data),
            **({"sha256": hashlib.sha256(data).hexdigest()} if checksums else {}),
        }
        for path, data in sorted(files.items())
    ]


def step_dir(data_dir: Path, tier: str, run: dict[str, Any], step: int) -> Path:
    """Where the service places a step on a default local tier."""
    return data_dir / tier / str(run["project"]) / str(run["name"]) / f"step-{step}"


def place_checkpoint(
    client: TestClient | httpx.Client,
    data_dir: Path,
    run: dict[str, Any],
    step: int,
    klass: str = "rolling",
    *,
    tier: str = "hot",
    files: dict[str, bytes] | None = None,
    created_at: datetime | None = None,
    checksums: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """Write a step's files on `tier` where the service itself would put them and register
    them (back-dated by an hour unless `created_at` is given, so no grace period applies)."""
    contents = files if files is not None else step_files(step)
    root = step_dir(data_dir, tier, run, step)
    uri = write_checkpoint(root.parent, root.name, contents)
    when = created_at or datetime.now(UTC) - timedelta(hours=1)
    response = register(
        client,
        run["id"],
        step,
        uri,
        klass,
        files=file_entries(contents, checksums=checksums),
        created_at=iso(when),
        **extra,
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` by its relative path; {} when `root` does not exist."""
    if not root.exists():
        return {}
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def end_run(
    client: TestClient | httpx.Client,
    run_id: str,
    ended_at: datetime,
    status: str = "completed",
) -> dict[str, Any]:
    response = client.patch(
        f"/v1/runs/{run_id}", json={"status": status, "ended_at": iso(ended_at)}
    )
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def fetch_checkpoint(client: TestClient | httpx.Client, checkpoint_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/checkpoints/{checkpoint_id}")
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def ledger(client: TestClient | httpx.Client, **filters: Any) -> list[dict[str, Any]]:
    """Every action of GET /v1/actions matching `filters`, all pages."""
    items, _pages = list_all(client, "/v1/actions", 1000, **filters)
    return items


def sweep_now(client: TestClient | httpx.Client, **body: Any) -> dict[str, Any]:
    """POST /v1/sweeps; must answer 202 with the sweep id and the ids it created."""
    response = client.post("/v1/sweeps", json=body or None)
    assert response.status_code == 202, response.text
    result: dict[str, Any] = response.json()
    return result


def put_policy(client: TestClient | httpx.Client, text: str) -> dict[str, Any]:
    """PUT a YAML policy; its name is read from the text."""
    name = yaml.safe_load(text)["name"]
    response = client.put(
        f"/v1/policies/{name}", content=text, headers={"content-type": "application/yaml"}
    )
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def make_executor(
    app: FastAPI,
    *,
    trash_retention: timedelta = timedelta(days=7),
    clock: Callable[[], datetime] | None = None,
) -> Worker:
    """A worker on the app's database and tiers (tests drain it themselves)."""
    state = app.state
    if clock is None:
        return Worker(
            state.session_factory,
            state.tiers,
            trash_retention=trash_retention,
            storages=state.storages,
        )
    return Worker(
        state.session_factory,
        state.tiers,
        trash_retention=trash_retention,
        clock=clock,
        storages=state.storages,
    )


def ago(**delta: float) -> datetime:
    """That long before now (UTC): `ago(days=8)`."""
    return datetime.now(UTC) - timedelta(**delta)


def tier_usage(client: TestClient | httpx.Client) -> dict[str, dict[str, int]]:
    """GET /v1/tiers as {tier name: {bytes, checkpoints}}."""
    response = client.get("/v1/tiers")
    assert response.status_code == 200, response.text
    return {t["name"]: t["usage"] for t in response.json()["items"]}


# --- reservations: asynchronous saves --------------------------------------------------------


def instant(text: str) -> datetime:
    """An ISO 8601 timestamp of an answer as a datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def reserve(
    client: TestClient | httpx.Client, data_dir: Path, run: dict[str, Any], step: int
) -> dict[str, Any]:
    """Reserve `step` where the service would place it (nothing written there yet)."""
    uri = f"file://{step_dir(data_dir, 'hot', run, step).resolve()}"
    response = register(client, run["id"], step, uri, committed=False, created_at=iso(ago(hours=1)))
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def write_partial(data_dir: Path, run: dict[str, Any], step: int) -> dict[str, bytes]:
    """The first shard of a save in flight, on disk; returns every shard the save will have."""
    files = step_files(step)
    root = step_dir(data_dir, "hot", run, step)
    root.mkdir(parents=True, exist_ok=True)
    (root / "shard-0.bin").write_bytes(files["shard-0.bin"])
    return files


def write_all(data_dir: Path, run: dict[str, Any], step: int) -> dict[str, bytes]:
    """Every shard of a save, on disk where the service would place the step."""
    files = step_files(step)
    root = step_dir(data_dir, "hot", run, step)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def checkpoint_post(
    client: TestClient | httpx.Client, checkpoint_id: str, verb: str, body: Any = None
) -> httpx.Response:
    """POST /v1/checkpoints/{id}/{verb} (commit, keepalive, abort, pin, undelete)."""
    return client.post(f"/v1/checkpoints/{checkpoint_id}/{verb}", json=body)


def audit_events(client: TestClient | httpx.Client, checkpoint_id: str) -> list[dict[str, Any]]:
    response = client.get("/v1/audit", params={"checkpoint_id": checkpoint_id})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


# --- access control ---------------------------------------------------------------------------

# Every token secret the tests made. None may appear in any log line of the run (conftest).
SECRETS: set[str] = set()


def remember_secret(secret: str) -> str:
    SECRETS.add(secret)
    return secret


def issue_token(
    app: FastAPI,
    *,
    name: str = "test",
    scopes: tuple[str, ...] = ("admin",),
    projects: tuple[str, ...] | None = None,
) -> tuple[str, str]:
    """A token made straight in the app's database: (id, secret)."""
    with session_scope(app.state.session_factory) as session:
        token, secret = create_token(
            session,
            name=name,
            scopes=scopes,
            projects=projects,
            actor="test",
            now=datetime.now(UTC),
        )
        return token.id, remember_secret(secret)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def token_client(app: FastAPI, secret: str | None) -> TestClient:
    """A client of `app` sending `secret` with every request (or no token at all). Start the
    app's lifespan with one client in a `with` block; these need none of their own."""
    return TestClient(app, headers=bearer(secret) if secret is not None else None)


def with_tiers(settings: Settings, tiers: list[dict[str, Any]]) -> Settings:
    """`settings` with a tiers file holding `tiers` (written beside the data directory)."""
    path = settings.data_dir.parent / "tiers.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"tiers": tiers}))
    return settings.model_copy(update={"tiers_file": path})


def active_checkpoint_rows(
    cid: str, run_id: str, step: int, klass: str, uri: str, size: int, made: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rows of an active checkpoint on `hot` (its checkpoint, its primary location), for
    tests that insert a catalog directly: thousands of runs through the API would take
    minutes."""
    checkpoint = {
        "id": cid,
        "run_id": run_id,
        "step": step,
        "klass": klass,
        "state": "active",
        "uri": uri,
        "tier": "hot",
        "size_bytes": size,
        "files": None,
        "metrics": {},
        "labels": {},
        "pinned": False,
        "created_at": made,
        "registered_at": made,
        "committed_at": made,
    }
    return checkpoint, {"checkpoint_id": cid, "tier": "hot", "uri": uri, "role": "primary"}
