"""Concurrent clients against a real server (uvicorn on a free port, many connections):
identical registrations collapse into one row, and a client reads back what it wrote."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine, text

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import write_checkpoint

CLIENTS = 32


@pytest.fixture
def base_url(settings: Settings, clean_engine: Engine) -> Iterator[str]:
    """A real HTTP server in a background thread, on a port the OS picked."""
    app = create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive(), "the server stopped while starting"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def all_at_once(base_url: str, call: Callable[[httpx.Client], httpx.Response]) -> list[Any]:
    """Run `call` from CLIENTS threads, each with its own connection, released together."""
    barrier = threading.Barrier(CLIENTS, timeout=30)

    def one(_: int) -> tuple[int, Any]:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            client.get("/healthz").raise_for_status()  # connect before the barrier
            barrier.wait()
            response = call(client)
            return response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        return list(pool.map(one, range(CLIENTS)))


def count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


@pytest.fixture
def run_id(base_url: str) -> str:
    response = httpx.post(f"{base_url}/v1/runs", json={"project": "proj", "name": "run-1"})
    assert response.status_code == 201, response.text
    run_id: str = response.json()["id"]
    return run_id


def test_identical_run_creations_leave_one_run(base_url: str, clean_engine: Engine) -> None:
    body = {"project": "racing", "name": "run-a", "labels": {"k": "v"}}

    results = all_at_once(base_url, lambda c: c.post("/v1/runs", json=body))

    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * (CLIENTS - 1) + [201], results
    assert len({run["id"] for _, run in results}) == 1
    assert count(clean_engine, "SELECT count(*) FROM runs") == 1
    assert count(clean_engine, "SELECT count(*) FROM projects WHERE name = 'racing'") == 1
    listed = httpx.get(f"{base_url}/v1/runs", params={"project": "racing"}).json()["items"]
    assert [run["id"] for run in listed] == [results[0][1]["id"]]


@pytest.mark.parametrize("with_files", [False, True], ids=["listed", "manifest"])
def test_identical_registrations_leave_one_checkpoint(
    base_url: str, clean_engine: Engine, data_dir: Path, run_id: str, with_files: bool
) -> None:
    files = {f"shard-{i}.bin": b"x" * (i + 1) for i in range(8)}
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-1000", files)
    body: dict[str, Any] = {"step": 1000, "class": "rolling", "uri": uri}
    if with_files:
        body["files"] = [{"path": p, "size_bytes": len(d)} for p, d in files.items()]

    results = all_at_once(base_url, lambda c: c.post(f"/v1/runs/{run_id}/checkpoints", json=body))

    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * (CLIENTS - 1) + [201], results
    assert len({checkpoint["id"] for _, checkpoint in results}) == 1
    assert all(checkpoint["size_bytes"] == 36 for _, checkpoint in results)
    assert count(clean_engine, "SELECT count(*) FROM checkpoints") == 1
    assert count(clean_engine, "SELECT count(*) FROM locations") == 1
    tiers = httpx.get(f"{base_url}/v1/tiers").json()["items"]
    assert tiers[0]["usage"] == {"bytes": 36, "checkpoints": 1}


def test_conflicting_registrations_keep_exactly_one_version(
    base_url: str, clean_engine: Engine, data_dir: Path, run_id: str
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-5")
    classes = ["rolling", "milestone"]
    counter = iter(range(CLIENTS))
    lock = threading.Lock()

    def post(client: httpx.Client) -> httpx.Response:
        with lock:
            klass = classes[next(counter) % 2]
        body = {"step": 5, "class": klass, "uri": uri}
        return client.post(f"/v1/runs/{run_id}/checkpoints", json=body)

    results = all_at_once(base_url, post)

    winners = [body for status, body in results if status in (200, 201)]
    losers = [body for status, body in results if status not in (200, 201)]
    assert [status for status, _ in results].count(201) == 1
    assert {status for status, _ in results} <= {200, 201, 409}, results
    assert len({w["class"] for w in winners}) == 1
    assert len(winners) == CLIENTS // 2
    assert all(loser["field"] == "step" for loser in losers)
    assert count(clean_engine, "SELECT count(*) FROM checkpoints") == 1
    assert count(clean_engine, "SELECT count(*) FROM locations") == 1


def test_concurrent_distinct_steps_are_all_kept(
    base_url: str, clean_engine: Engine, data_dir: Path, run_id: str
) -> None:
    uris = [write_checkpoint(data_dir / "hot", f"proj/run-1/step-{i}") for i in range(CLIENTS)]
    counter = iter(range(CLIENTS))
    lock = threading.Lock()

    def post(client: httpx.Client) -> httpx.Response:
        with lock:
            step = next(counter)
        body = {"step": step, "class": "rolling", "uri": uris[step]}
        return client.post(f"/v1/runs/{run_id}/checkpoints", json=body)

    results = all_at_once(base_url, post)

    assert [status for status, _ in results] == [201] * CLIENTS, results
    assert count(clean_engine, "SELECT count(*) FROM checkpoints") == CLIENTS
    listed = httpx.get(f"{base_url}/v1/runs/{run_id}/checkpoints").json()["items"]
    assert [c["step"] for c in listed] == list(range(CLIENTS - 1, -1, -1))


def test_a_client_reads_back_what_it_was_just_told_exists(base_url: str, data_dir: Path) -> None:
    """The answer leaves only after the commit: another connection sees the row at once."""
    with (
        httpx.Client(base_url=base_url) as writer,
        httpx.Client(base_url=base_url) as reader,
    ):
        for i in range(40):
            run = writer.post("/v1/runs", json={"project": "proj", "name": f"run-{i}"})
            assert run.status_code == 201, run.text
            assert reader.get(f"/v1/runs/{run.json()['id']}").status_code == 200, i

            uri = write_checkpoint(data_dir / "hot", f"proj/run-{i}/step-1")
            body = {"step": 1, "class": "rolling", "uri": uri}
            created = writer.post(f"/v1/runs/{run.json()['id']}/checkpoints", json=body)
            assert created.status_code == 201, created.text
            read = reader.get(f"/v1/checkpoints/{created.json()['id']}")
            assert read.status_code == 200, i
            assert read.json() == created.json()
