"""A registration is answered the same whichever way it takes through the app: the fast
path answers those that succeed, the route every other (app.api.fast_registration). Each
refusal below goes through the fast path first and must still come back as the route's
problem, having written nothing; each success must be what GET then shows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.builders import (
    assert_problem,
    audit_events,
    bearer,
    file_entries,
    issue_token,
    step_dir,
    step_files,
    write_checkpoint,
)


def _body(data_dir: Path, run: dict[str, Any], step: int) -> dict[str, Any]:
    contents = step_files(step)
    root = step_dir(data_dir, "hot", run, step)
    uri = write_checkpoint(root.parent, root.name, contents)
    return {"step": step, "class": "rolling", "uri": uri, "files": file_entries(contents)}


@pytest.fixture
def run(admin_client: TestClient) -> dict[str, Any]:
    response = admin_client.post("/v1/runs", json={"project": "mine", "name": "r"})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def job_secret(auth_app: FastAPI) -> str:
    """What a training job holds: a register token for its project."""
    return issue_token(auth_app, name="job", scopes=("register",), projects=("mine",))[1]


def _steps(admin_client: TestClient, run: dict[str, Any]) -> list[int]:
    listed = admin_client.get(f"/v1/runs/{run['id']}/checkpoints").json()["items"]
    return sorted(c["step"] for c in listed)


def test_a_registration_answers_what_get_shows_then_200_when_sent_again(
    auth_client: TestClient,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    job_secret: str,
) -> None:
    body = _body(data_dir, run, 1)
    path = f"/v1/runs/{run['id']}/checkpoints"
    first = auth_client.post(path, json=body, headers=bearer(job_secret))
    assert first.status_code == 201, first.text
    assert first.headers["content-type"] == "application/json"
    created = first.json()
    assert created == admin_client.get(f"/v1/checkpoints/{created['id']}").json()
    assert created["created_by"].startswith("token:") and created["created_by"].endswith(":job")
    again = auth_client.post(path, json=body, headers=bearer(job_secret))
    assert again.status_code == 200, again.text
    assert again.json() == created
    assert _steps(admin_client, run) == [1]


def test_on_postgresql_a_new_registration_is_made_on_the_event_loop_with_its_audit_event(
    auth_app: FastAPI,
    auth_client: TestClient,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    job_secret: str,
) -> None:
    """PostgreSQL's registrations use the loop's own connections (no worker thread for the
    database); SQLite's stay in threads. Either way the checkpoint, its audit event and its
    run's totals are written by the one statement."""
    on_loop = auth_app.state.event_loop_pool
    if auth_app.state.engine.dialect.name != "postgresql":
        assert on_loop is None
    path = f"/v1/runs/{run['id']}/checkpoints"
    before = on_loop.pool.get_stats().get("requests_num", 0) if on_loop else 0
    first = auth_client.post(path, json=_body(data_dir, run, 1), headers=bearer(job_secret))
    assert first.status_code == 201, first.text
    if on_loop is not None:
        # one connection taken: the token's lookup and the insert
        assert on_loop.pool.get_stats()["requests_num"] == before + 1
    created = first.json()
    trail = audit_events(admin_client, created["id"])
    assert [e["event"] for e in trail] == ["registered"]
    assert trail[0]["actor"] == created["created_by"]
    assert trail[0]["after"]["size_bytes"] == created["size_bytes"]
    with auth_app.state.engine.connect() as connection:
        totals = connection.execute(
            text("SELECT active_checkpoints, active_bytes FROM runs WHERE id = :id"),
            {"id": run["id"]},
        ).one()
    assert tuple(totals) == (1, created["size_bytes"])


def test_a_tier_on_a_network_file_system_is_checked_in_a_thread_with_the_same_answer(
    auth_app: FastAPI,
    auth_client: TestClient,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    job_secret: str,
) -> None:
    """Where a local tier is on NFS or the like (app.storage.mounts), its checks leave the
    event loop; the registration and its refusals are the same."""
    auth_app.state.files_on_loop = False
    path = f"/v1/runs/{run['id']}/checkpoints"
    body = _body(data_dir, run, 5)
    made = auth_client.post(path, json=body, headers=bearer(job_secret))
    assert made.status_code == 201, made.text
    assert made.json() == admin_client.get(f"/v1/checkpoints/{made.json()['id']}").json()
    missing = {**_body(data_dir, run, 6), "uri": body["uri"] + "-not-there"}
    assert_problem(auth_client.post(path, json=missing, headers=bearer(job_secret)), 422, "uri")
    assert _steps(admin_client, run) == [5]


def test_a_token_already_seen_is_checked_again_at_every_registration(
    auth_app: FastAPI,
    auth_client: TestClient,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
) -> None:
    """The fast path looks a token up once per process and lets the insert check the
    rest: a revoked token is refused at once, and one bounded to a project still cannot
    register into another's run."""
    token_id, secret = issue_token(auth_app, name="job", scopes=("register",), projects=("mine",))
    path = f"/v1/runs/{run['id']}/checkpoints"
    first = auth_client.post(path, json=_body(data_dir, run, 1), headers=bearer(secret))
    assert first.status_code == 201, first.text

    theirs = admin_client.post("/v1/runs", json={"project": "theirs", "name": "t"}).json()
    other_path = f"/v1/runs/{theirs['id']}/checkpoints"
    elsewhere = auth_client.post(
        other_path, json=_body(data_dir, theirs, 1), headers=bearer(secret)
    )
    assert_problem(elsewhere, 403)
    assert _steps(admin_client, theirs) == []

    second = auth_client.post(path, json=_body(data_dir, run, 2), headers=bearer(secret))
    assert second.status_code == 201, second.text
    assert second.json()["created_by"] == first.json()["created_by"]

    assert admin_client.delete(f"/v1/tokens/{token_id}").status_code == 204
    revoked = auth_client.post(path, json=_body(data_dir, run, 3), headers=bearer(secret))
    assert_problem(revoked, 401)
    assert _steps(admin_client, run) == [1, 2]


def test_a_body_sent_in_pieces_is_registered_whole(
    auth_app: FastAPI,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    job_secret: str,
) -> None:
    """A body streamed in several ASGI messages (as a chunked upload arrives)."""
    raw = httpx.Request("POST", "http://x", json=_body(data_dir, run, 7)).read()
    pieces = [raw[i : i + 100] for i in range(0, len(raw), 100)]
    assert len(pieces) > 3

    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=auth_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(
                f"/v1/runs/{run['id']}/checkpoints",
                content=chunks(),
                headers={"content-type": "application/json", **bearer(job_secret)},
            )

    # A thread of its own: another fixture of the session (the console's browser) may
    # already run an event loop in this one.
    with ThreadPoolExecutor(max_workers=1) as pool:
        response = pool.submit(asyncio.run, send()).result()
    assert response.status_code == 201, response.text
    assert response.json()["step"] == 7
    assert len(response.json()["files"]) == 2
    assert _steps(admin_client, run) == [7]


def test_refusals_are_the_route_s_problems_and_write_nothing(
    auth_app: FastAPI,
    auth_client: TestClient,
    admin_client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    job_secret: str,
) -> None:
    path = f"/v1/runs/{run['id']}/checkpoints"
    good = _body(data_dir, run, 3)
    token = bearer(job_secret)
    theirs = issue_token(auth_app, name="other", scopes=("register",), projects=("theirs",))[1]
    reader = issue_token(auth_app, name="reader", scopes=("read",), projects=("*",))[1]

    missing = auth_client.post(path, json=good)
    assert_problem(missing, 401)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert_problem(auth_client.post(path, json=good, headers=bearer("not-a-token")), 401)
    assert_problem(auth_client.post(path, json=good, headers=bearer(theirs)), 403)
    assert_problem(auth_client.post(path, json=good, headers=bearer(reader)), 403)
    # no token and a bad body: the token is checked first, as on every route
    assert_problem(auth_client.post(path, json={"step": -1}), 401)
    assert_problem(auth_client.post(path, json={**good, "step": "x"}, headers=token), 422, "step")
    assert_problem(
        auth_client.post(path, content=b'{"step": 3,', headers=token | _JSON), 400, "body"
    )
    as_text = auth_client.post(path, content=b"{}", headers=token | {"content-type": "text/plain"})
    assert_problem(as_text, 415, "body")
    query = auth_client.post(path + "?force=1", json=good, headers=token)
    assert_problem(query, 422, "force")
    assert_problem(
        auth_client.post("/v1/runs/run_nothing/checkpoints", json=good, headers=token),
        404,
        "run_id",
    )
    outside = {**good, "uri": "file:///nowhere/step-3"}
    assert_problem(auth_client.post(path, json=outside, headers=token), 422, "uri")
    assert _steps(admin_client, run) == []

    registered = auth_client.post(path, json=good, headers=token)
    assert registered.status_code == 201, registered.text
    one = good["files"][0]  # a file of the registered directory, as a checkpoint of its own
    inside = {**good, "step": 4, "uri": f"{good['uri']}/{one['path']}", "files": [one]}
    overlap = assert_problem(auth_client.post(path, json=inside, headers=token), 409, "uri")
    assert overlap["checkpoint_id"] == registered.json()["id"]
    changed = {**good, "class": "milestone"}
    assert_problem(auth_client.post(path, json=changed, headers=token), 409)
    assert _steps(admin_client, run) == [3]


_JSON = {"content-type": "application/json"}
