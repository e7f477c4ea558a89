"""Run inside a fresh environment holding only ckpt-client (tests/client/test_distribution.py):
the client's code paths that differ by Python version, against scripted answers. Python 3.10
code, like the client's own (no `datetime.UTC`)."""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

import ckpt_client
from ckpt_client import Client, Conflict
from ckpt_client.models import parse_time

RUN: dict[str, Any] = {
    "id": "run_1",
    "project": "p",
    "name": "r",
    "status": "active",
    "labels": {},
    "started_at": "2026-01-02T03:04:05Z",
    "ended_at": None,
}
CKPT: dict[str, Any] = {
    "id": "ckpt_1",
    "run_id": "run_1",
    "step": 1,
    "class": "rolling",
    "state": "active",
    "tier": "hot",
    "uri": "file:///data/hot/p/r/step-1",
    "size_bytes": 3,
    "metrics": {},
    "pinned": False,
    "created_at": "2026-01-02T03:04:05.123Z",
    "locations": [{"tier": "hot", "uri": "file:///data/hot/p/r/step-1", "role": "primary"}],
}


def main() -> None:
    assert not {"fastapi", "sqlalchemy", "app"} & set(sys.modules)
    assert parse_time("2026-01-02T03:04:05.5Z") == datetime(
        2026, 1, 2, 3, 4, 5, 500000, tzinfo=timezone.utc
    )
    up = {"value": False}
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if not up["value"]:
            raise httpx.ConnectError("refused")
        if request.url.path == "/v1/runs":
            return httpx.Response(201, json=RUN)
        if request.url.path.endswith("/checkpoints"):
            sent.append(json.loads(request.content))
            if sent[-1]["step"] == 2:
                return httpx.Response(409, json={"status": 409, "field": "step", "detail": "no"})
            return httpx.Response(201, json=CKPT)
        return httpx.Response(404, json={"status": 404, "detail": "nothing"})

    with tempfile.TemporaryDirectory() as spool:
        client = Client(
            "http://catalog.test",
            spool_dir=spool,
            deadline=0.2,
            transport=httpx.MockTransport(handle),
        )
        up["value"] = True
        run = client.run("p", "r")
        assert run.started_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        up["value"] = False
        assert run.register(1, Path("/data/hot/p/r/step-1")) is None
        assert len(client.spool.pending()) == 1
        up["value"] = True
        ckpt = run.register(3, "file:///data/hot/p/r/step-3")
        assert ckpt is not None and ckpt.created_at is not None and ckpt.local_path is not None
        assert [body["step"] for body in sent] == [1, 3] and "created_at" in sent[0]
        try:
            run.register(2, "file:///data/hot/p/r/step-2")
        except Conflict as error:
            assert error.field == "step"
        else:
            raise AssertionError("no Conflict")
        client.close()
    print("probe ok", sys.version_info[:2], ckpt_client.__version__)


if __name__ == "__main__":
    main()
