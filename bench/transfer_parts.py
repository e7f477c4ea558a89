"""The parts of the transfer benchmark: local S3 servers, a byte-counting proxy, and a
catalog whose `ckpt` commands run as child processes and whose moves are checked."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench.import_tree import S3_ENV, free_port, settle_disk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
MiB = 1024 * 1024
ENV = S3_ENV  # moto takes any keys; rclone serve s3 (import_tree.rclone_s3) these


@contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()
    with serving([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port) as url:
        yield url


@contextmanager
def serving(command: list[str], port: int) -> Iterator[str]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:  # moto holding gigabytes can be slow to go
            process.kill()
            process.wait()


class CountingProxy:
    """Forwards to the S3 server and counts body bytes in both directions."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.bytes_up = 0
        self.bytes_down = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                conn = http.client.HTTPConnection(proxy.upstream, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                with proxy.lock:
                    proxy.bytes_up += len(body)
                    proxy.bytes_down += len(data)
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # a HEAD's length is the object's, not that of the (empty) body read here
                upstream_length = response.getheader("content-length") or "0"
                self.send_header(
                    "content-length", upstream_length if self.command == "HEAD" else str(len(data))
                )
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def make_shards(root: Path, count: int, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MiB)
    for i in range(count):
        with open(root / f"shard-{i:02d}.bin", "wb") as out:
            for _ in range(size // MiB):
                out.write(block)


class Service:
    """A catalog on SQLite with the given tiers; the `ckpt` commands run as child processes."""

    def __init__(self, work: Path, tiers: list[dict[str, Any]]) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        (work / "policies").mkdir(exist_ok=True)
        (work / "tiers.yaml").write_text(yaml.safe_dump({"tiers": tiers}))
        self.env = {
            **os.environ,
            **ENV,
            "CKPT_DATABASE_URL": f"sqlite:///{work / 'ckpt.db'}",
            "CKPT_TIERS_FILE": str(work / "tiers.yaml"),
            "CKPT_POLICIES_DIR": str(work / "policies"),
            "CKPT_DATA_DIR": str(work / "data"),
            "CKPT_AUTH": "off",
            "CKPT_TRASH_RETENTION": "7d",
            # this checkout's code, whichever checkout the environment's editable install
            # points at (bench.register.this_checkout)
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.log = work / "ckpt.log"
        self.ckpt("migrate")

    def ckpt(self, *args: str) -> tuple[float, int]:
        """Run `ckpt args...`: (seconds, peak RSS in bytes); its log goes to `self.log`."""
        started = time.perf_counter()
        with open(self.log, "w") as log, open(self.work / "stdout.txt", "w") as out:
            process = subprocess.Popen(
                [str(BIN / "ckpt"), *args], env=self.env, stdout=out, stderr=log
            )
            _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        if status != 0:
            raise SystemExit(f"ckpt {' '.join(args)} failed:\n{self.log.read_text()[-3000:]}")
        return elapsed, usage.ru_maxrss * 1024

    def policy(self, to_tier: str) -> None:
        text = (
            f"name: bench\nrules:\n  - name: move\n    class: milestone\n"
            f"    when: {{run_ended: 0s}}\n    action: {{move_to: {to_tier}}}\n"
        )
        (self.work / "policies" / "bench.yaml").write_text(text)

    @contextmanager
    def client(self) -> Iterator[Any]:
        """The catalog's API in this process (no background work): a TestClient."""
        from fastapi.testclient import TestClient

        from app.main import NO_BACKGROUND, create_app
        from app.settings import load_settings

        os.environ.update({k: v for k, v in self.env.items() if k.startswith("CKPT_")})
        with TestClient(create_app(load_settings(), roles=NO_BACKGROUND)) as client:
            yield client

    def sweep(self) -> None:
        with self.client() as client:
            response = client.post("/v1/sweeps")
            assert response.status_code == 202, response.text

    def register(self, uri: str, run_name: str = "run") -> str:
        """Register one ended run's milestone at `uri` (files listed by the service); its id."""
        with self.client() as client:
            run = client.post(
                "/v1/runs",
                json={"project": "bench", "name": run_name, "started_at": "2020-01-01T00:00:00Z"},
            ).json()
            created = client.post(
                f"/v1/runs/{run['id']}/checkpoints",
                json={
                    "step": 1,
                    "class": "milestone",
                    "uri": uri,
                    "created_at": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
                },
            )
            assert created.status_code == 201, created.text
            ended = client.patch(
                f"/v1/runs/{run['id']}",
                json={
                    "status": "completed",
                    "ended_at": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
                },
            )
            assert ended.status_code == 200, ended.text
            return str(created.json()["id"])

    def move(self, checkpoint_id: str, to_tier: str) -> Moved:
        """Plan the move with `ckpt sweep`, execute it with `ckpt worker --once`; fails
        unless the action ended `done` with the checkpoint on `to_tier` alone."""
        self.policy(to_tier)
        self.sweep()
        settle_disk()
        seconds, rss = self.ckpt("worker", "--once")
        with sqlite3.connect(self.work / "ckpt.db") as db:
            actions = db.execute(
                "SELECT id, state, error FROM actions WHERE checkpoint_id = ? AND to_tier = ?",
                (checkpoint_id, to_tier),
            ).fetchall()
            tiers = db.execute(
                "SELECT tier, role FROM locations WHERE checkpoint_id = ?", (checkpoint_id,)
            ).fetchall()
        if len(actions) != 1 or actions[0][1] != "done":
            raise SystemExit(f"the move of {checkpoint_id} to {to_tier} did not succeed: {actions}")
        if tiers != [(to_tier, "primary")]:
            raise SystemExit(f"{checkpoint_id} is at {tiers} after its move to {to_tier}")
        phases = [
            entry
            for entry in map(json.loads, self.log.read_text().splitlines())
            if entry.get("msg") == "transfer phases" and entry.get("action_id") == actions[0][0]
        ]
        assert len(phases) == 1, f"no phase timings logged for {actions[0][0]}"
        return Moved(seconds, rss, {k: v for k, v in phases[0].items() if k.endswith("_s")})


@dataclass
class Moved:
    """One move by a worker process: its whole run, and the transfer's own phases (from
    claim to done: what a long-lived worker spends)."""

    process_s: float
    peak_rss: int
    phases: dict[str, float]


def timed(command: list[str], env: dict[str, str]) -> float:
    settle_disk()
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started
