"""How the client waits for a restore it cannot make the real service fail on demand: a
failed action, a wait past its timeout, a copy that arrived meanwhile (scripted answers)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ckpt_client import Client, RestoreFailed
from ckpt_client import staging as staging_module

CKPT: dict[str, Any] = {
    "id": "ckpt_1",
    "run_id": "run_1",
    "step": 40,
    "class": "rolling",
    "state": "active",
    "tier": "archive",
    "uri": "s3://b/p/r/step-40",
    "size_bytes": 10,
    "metrics": {},
    "pinned": False,
    "locations": [{"tier": "archive", "uri": "s3://b/p/r/step-40", "role": "primary"}],
}
ON_HOT = {
    **CKPT,
    "locations": [
        *CKPT["locations"],
        {"tier": "hot", "uri": "file:///data/hot/p/r/step-40", "role": "replica"},
    ],
}


def action(state: str, **extra: Any) -> dict[str, Any]:
    return {"id": "act_1", "state": state, "bytes": 10, "bytes_done": 0, "phase": None, **extra}


def service(
    actions: list[dict[str, Any]], *, arrives_after: int | None = None
) -> Callable[[httpx.Request], httpx.Response]:
    """The checkpoint (on `hot` from the `arrives_after`-th read on) and its restore
    action, whose state follows `actions` poll by poll."""
    reads = {"checkpoint": 0, "action": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/restore"):
            return httpx.Response(202, json=action("pending"))
        if path.startswith("/v1/actions/"):
            reads["action"] += 1
            return httpx.Response(200, json=actions[min(reads["action"], len(actions)) - 1])
        reads["checkpoint"] += 1
        there = arrives_after is not None and reads["checkpoint"] > arrives_after
        return httpx.Response(200, json=ON_HOT if there else CKPT)

    return handle


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging_module, "POLL_FIRST", 0.01)
    monkeypatch.setattr(staging_module, "POLL_CAP", 0.02)


def client_of(handler: Callable[[httpx.Request], httpx.Response], tmp: Any) -> Client:
    return Client("http://catalog.test", spool_dir=tmp, transport=httpx.MockTransport(handler))


def test_the_wait_logs_each_poll_and_ends_with_the_copy(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    running = action("running", bytes_done=4, phase="restoring/2")
    handler = service([action("pending"), running, running], arrives_after=3)
    caplog.set_level(logging.INFO, logger="ckpt_client")
    with client_of(handler, tmp_path) as client:
        staged = client.restore("ckpt_1", "hot")
    assert staged.location("hot") is not None
    polls = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting")]
    assert len(polls) == 2, polls  # the third poll finds the copy
    assert "running, phase restoring/2, 4/10 bytes" in polls[1]


def test_a_failed_restore_raises_with_the_action(tmp_path: Any) -> None:
    handler = service([action("running"), action("failed", error="AccessDenied on GET")])
    with client_of(handler, tmp_path) as client, pytest.raises(RestoreFailed) as failed:
        client.restore("ckpt_1", "hot")
    assert "AccessDenied on GET" in str(failed.value)
    assert failed.value.problem["state"] == "failed"


def test_a_wait_past_its_timeout_raises(tmp_path: Any) -> None:
    handler = service([action("running", phase="restoring/1")])
    with client_of(handler, tmp_path) as client, pytest.raises(TimeoutError, match="not on hot"):
        client.restore("ckpt_1", "hot", timeout=0.1)


def test_without_wait_the_restore_is_only_asked_for(tmp_path: Any) -> None:
    handler = service([action("pending")])
    with client_of(handler, tmp_path) as client:
        asked = client.restore("ckpt_1", "hot", wait=False)
    assert asked.location("hot") is None


def test_a_copy_that_arrived_meanwhile_is_no_error(tmp_path: Any) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/restore"):
            body = {"status": 409, "detail": "already on hot", "field": "tier"}
            return httpx.Response(409, json=body)
        return httpx.Response(200, json=CKPT if request.method == "GET" and not seen else ON_HOT)

    seen: list[int] = []
    with client_of(handle, tmp_path) as client:
        before = client.checkpoint("ckpt_1")
        seen.append(1)
        staged = staging_module.stage(client, before, "hot", wait=True, timeout=None)
    assert staged.location("hot") is not None
