"""The reservation's keepalive thread and its abort path against scripted answers that
follow DESIGN section 12 (`reserved_until`, keepalive, abort): timing, stopping, and what
it does when the service says the reservation is gone. The real service's half is in
test_reservations_server.py."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_client import Client
from ckpt_client.reservation import keepalive_interval

TTL = timedelta(seconds=1)
RUN = {"id": "run_1", "project": "p", "name": "r", "status": "active", "labels": {}}


class Reservations:
    """A service holding one reservation: keepalives move `reserved_until`, commit and abort
    end it, and anything after that is a 409."""

    def __init__(self, *, refuse_keepalives: bool = False) -> None:
        self.state = "writing"
        self.until = datetime.now(UTC) + TTL
        self.keepalives: list[float] = []
        self.aborted_with: dict[str, Any] | None = None
        self.refuse_keepalives = refuse_keepalives
        self.lock = threading.Lock()

    def checkpoint(self) -> dict[str, Any]:
        return {
            "id": "ckpt_1",
            "run_id": "run_1",
            "step": 1,
            "class": "rolling",
            "state": self.state,
            "tier": "hot",
            "uri": "file:///data/hot/p/r/step-1",
            "size_bytes": 0,
            "metrics": {},
            "pinned": False,
            "locations": [],
            "reserved_until": self.until.isoformat() if self.state == "writing" else None,
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        now = datetime.now(UTC)
        headers = {"date": format_datetime(now, usegmt=True)}
        path = request.url.path
        with self.lock:
            if path == "/v1/runs":
                return httpx.Response(201, json=RUN, headers=headers)
            if path.endswith("/checkpoints"):
                return httpx.Response(201, json=self.checkpoint(), headers=headers)
            if self.state != "writing":
                return httpx.Response(409, json={"status": 409, "detail": self.state})
            if path.endswith("/keepalive"):
                if self.refuse_keepalives:
                    self.state = "trashed"
                    return httpx.Response(409, json={"status": 409, "detail": "abandoned"})
                self.keepalives.append(time.monotonic())
                self.until = now + TTL
            elif path.endswith("/commit"):
                self.state = "active"
            elif path.endswith("/abort"):
                self.state = "trashed"
                self.aborted_with = json.loads(request.content)
            return httpx.Response(200, json=self.checkpoint(), headers=headers)


def client_of(service: Reservations, tmp_path: Path) -> Client:
    return Client("http://catalog.test", spool_dir=tmp_path, transport=httpx.MockTransport(service))


def test_the_interval_is_a_fraction_of_what_the_service_granted() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert keepalive_interval(now + timedelta(minutes=30), now) == 450.0
    assert keepalive_interval(now + timedelta(seconds=1), now) == 0.25
    assert keepalive_interval(now - timedelta(seconds=5), now) == 0.2  # lapsed: at once


def test_an_open_reservation_is_kept_alive_until_its_commit(tmp_path: Path) -> None:
    service = Reservations()
    with client_of(service, tmp_path) as client:
        run = client.run("p", "r")
        with run.reserve(1, "file:///data/hot/p/r/step-1") as pending:
            time.sleep(1.5)  # 1.5 TTLs: lapsed without keepalives
            assert service.state == "writing"
            assert service.until > datetime.now(UTC)
        sent = len(service.keepalives)
        time.sleep(0.5)
    assert pending.checkpoint is not None and pending.checkpoint.state == "active"
    assert 3 <= sent <= 10, service.keepalives
    assert len(service.keepalives) == sent  # none after the commit
    gaps = [b - a for a, b in zip(service.keepalives, service.keepalives[1:], strict=False)]
    assert all(0.1 <= gap <= 0.8 for gap in gaps), gaps  # a fourth of 1-2 s (Date: whole s)


def test_an_exception_aborts_with_its_reason_and_propagates(tmp_path: Path) -> None:
    service = Reservations()
    with client_of(service, tmp_path) as client:
        run = client.run("p", "r")
        with pytest.raises(KeyError), run.reserve(1, "file:///data/hot/p/r/step-1") as pending:
            raise KeyError("shard-3")
    assert service.state == "trashed"
    assert service.aborted_with == {"reason": "KeyError: 'shard-3'"}
    assert pending.checkpoint is not None and pending.checkpoint.state == "trashed"


def test_a_reservation_the_service_gave_up_stops_its_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = Reservations(refuse_keepalives=True)
    with client_of(service, tmp_path) as client:
        run = client.run("p", "r")
        reservation = run.reserve(1, "file:///data/hot/p/r/step-1")
        time.sleep(0.6)
        assert reservation._keepalive is not None
        assert reservation._keepalive.lapsed is not None
        assert reservation._keepalive.lapsed.status == 409
    assert any("no longer kept alive" in r.getMessage() for r in caplog.records)


def test_a_service_without_reserved_until_gets_no_thread(tmp_path: Path) -> None:
    service = Reservations()
    service.checkpoint = lambda: {  # type: ignore[method-assign]
        **Reservations.checkpoint(service),
        "reserved_until": None,
    }
    with client_of(service, tmp_path) as client:
        reservation = client.run("p", "r").reserve(1, "file:///data/hot/p/r/step-1")
        assert reservation._keepalive is None
        assert reservation.commit() is not None
