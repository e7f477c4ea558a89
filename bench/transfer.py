"""Transfers against peers on the same local S3 server (moto), in one run.

    .venv/bin/python bench/transfer.py            # or: make bench-transfer

1. Move a 2 GiB checkpoint of 16 shards local -> S3, then S3 -> S3 (another bucket), with
   the service's own worker process (`ckpt worker --once`, a real ledger action each),
   and copy the same files with `s5cmd cp` and `rclone copy`. Reports throughput, the
   ratio to the best peer, and the worker's peak RSS (ru_maxrss of the child process).
2. A class change in place (two tiers on one bucket prefix): the bytes that pass through
   the worker, counted by a proxy between the worker and the S3 server (request and
   response bodies), not assumed.
3. Delete 100,000 objects: the S3 adapter's delete_prefix against `s5cmd rm`, both on one
   `rclone serve s3` server, whose buckets are directories: the objects are written
   straight to disk (moto takes about 10 ms a PUT, so filling it would take the hour).

The worker's time includes its start-up (imports, database); the empty start-up is
measured too and reported beside it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent

from app.storage.s3 import S3Storage  # noqa: E402

MiB = 1024 * 1024
ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()
    with serving([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port) as url:
        yield url


@contextmanager
def rclone_server(root: Path) -> Iterator[str]:
    port = free_port()
    key = f"{ENV['AWS_ACCESS_KEY_ID']},{ENV['AWS_SECRET_ACCESS_KEY']}"
    command = [
        str(BIN / "rclone"),
        "serve",
        "s3",
        "--config",
        os.devnull,
        "--auth-key",
        key,
        "--addr",
        f"127.0.0.1:{port}",
        str(root),
    ]
    with serving(command, port) as url:
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
                self.send_header("content-length", str(len(data)))
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
        }
        self.ckpt("migrate")

    def ckpt(self, *args: str) -> tuple[float, int]:
        """Run `ckpt args...`: (seconds, peak RSS in bytes)."""
        started = time.perf_counter()
        process = subprocess.Popen(
            [str(BIN / "ckpt"), *args], env=self.env, stdout=subprocess.PIPE, text=True
        )
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        if status != 0:
            raise SystemExit(
                f"ckpt {' '.join(args)} failed: {process.stdout and process.stdout.read()}"
            )
        return elapsed, usage.ru_maxrss * 1024

    def policy(self, to_tier: str) -> None:
        text = (
            f"name: bench\nrules:\n  - name: move\n    class: milestone\n"
            f"    when: {{run_ended: 0s}}\n    action: {{move_to: {to_tier}}}\n"
        )
        (self.work / "policies" / "bench.yaml").write_text(text)

    def register(self, uri: str) -> None:
        """Register one ended run's milestone at `uri` (files listed by the service)."""
        from fastapi.testclient import TestClient

        from app.main import NO_BACKGROUND, create_app
        from app.settings import load_settings

        os.environ.update({k: v for k, v in self.env.items() if k.startswith("CKPT_")})
        app = create_app(load_settings(), roles=NO_BACKGROUND)
        with TestClient(app) as client:
            run = client.post(
                "/v1/runs",
                json={"project": "bench", "name": "run", "started_at": "2020-01-01T00:00:00Z"},
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

    def move(self, to_tier: str) -> tuple[float, int]:
        """Plan the move with `ckpt sweep`, execute it with `ckpt worker --once`."""
        self.policy(to_tier)
        self.ckpt("sweep")
        return self.ckpt("worker", "--once")


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--delete-objects", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "transfer.json")
    args = parser.parse_args()
    os.environ.update(ENV)
    total = args.shards * args.shard_mib * MiB
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.python_version()}",
        "checkpoint": f"{args.shards} x {args.shard_mib} MiB",
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp, moto_server() as s3_url:
        work = Path(tmp)
        s3 = boto3.client("s3", endpoint_url=s3_url)
        for bucket in ("svc-a", "svc-b", "s5-a", "s5-b", "rc-a", "rc-b", "inplace"):
            s3.create_bucket(Bucket=bucket)
        source = work / "data" / "hot" / "bench" / "run" / "step-1"
        make_shards(source, args.shards, args.shard_mib * MiB)
        print(f"{total / MiB:.0f} MiB in {args.shards} shards written", flush=True)

        def tier(
            name: str, bucket: str, klass: str | None = None, url: str = s3_url
        ) -> dict[str, Any]:
            out: dict[str, Any] = {"name": name, "url": f"s3://{bucket}/ckpt", "endpoint_url": url}
            if klass:
                out["storage_class"] = klass
            return out

        service = Service(
            work / "svc",
            [
                {"name": "hot", "url": f"file://{work / 'data' / 'hot'}"},
                tier("s3a", "svc-a"),
                tier("s3b", "svc-b"),
            ],
        )
        service.register(f"file://{source}")
        startup, _ = service.ckpt("worker", "--once")
        # the service moves (and so deletes the source): keep a copy for the peers
        shutil.copytree(source, work / "peer-src")
        peer_src = work / "peer-src"
        local_s3_s, rss_1 = service.move("s3a")
        s3_s3_s, rss_2 = service.move("s3b")

        rclone_env = {
            **os.environ,
            "RCLONE_CONFIG_MOTO_TYPE": "s3",
            "RCLONE_CONFIG_MOTO_PROVIDER": "Other",
            "RCLONE_CONFIG_MOTO_ENDPOINT": s3_url,
            "RCLONE_CONFIG_MOTO_ACCESS_KEY_ID": "bench",
            "RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY": "bench",
        }
        s5 = [str(BIN / "s5cmd"), "--endpoint-url", s3_url]
        peers = {
            "s5cmd": (
                timed([*s5, "cp", f"{peer_src}/*", "s3://s5-a/ckpt/"], dict(os.environ)),
                timed([*s5, "cp", "s3://s5-a/ckpt/*", "s3://s5-b/ckpt/"], dict(os.environ)),
            ),
            "rclone": (
                timed([str(BIN / "rclone"), "copy", str(peer_src), "moto:rc-a/ckpt"], rclone_env),
                timed(
                    [str(BIN / "rclone"), "copy", "moto:rc-a/ckpt", "moto:rc-b/ckpt"], rclone_env
                ),
            ),
        }
        best_local = min(p[0] for p in peers.values())
        best_s3 = min(p[1] for p in peers.values())
        results["move"] = {
            "worker_startup_s": round(startup, 2),
            "local_to_s3_s": round(local_s3_s, 2),
            "s3_to_s3_s": round(s3_s3_s, 2),
            "peers_s": {k: [round(v[0], 2), round(v[1], 2)] for k, v in peers.items()},
            "local_to_s3_MiB_s": round(total / MiB / local_s3_s, 1),
            "s3_to_s3_MiB_s": round(total / MiB / s3_s3_s, 1),
            "ratio_local_to_s3": round(best_local / local_s3_s, 2),
            "ratio_s3_to_s3": round(best_s3 / s3_s3_s, 2),
            "ratio_local_to_s3_without_startup": round(best_local / (local_s3_s - startup), 2),
            "ratio_s3_to_s3_without_startup": round(best_s3 / (s3_s3_s - startup), 2),
            "worker_peak_rss_MiB": round(max(rss_1, rss_2) / MiB, 1),
        }
        print(json.dumps(results["move"], indent=2), flush=True)

        # 2. a class change in place, through a counting proxy
        proxy = CountingProxy(s3_url)
        inplace = Service(
            work / "inplace",
            [
                {"name": "hot", "url": f"file://{work / 'data' / 'hot'}"},
                tier("ia", "inplace", "STANDARD_IA", proxy.url),
                tier("glacier", "inplace", "GLACIER_IR", proxy.url),
            ],
        )
        subprocess.run(
            [
                *s5,
                "cp",
                "--storage-class",
                "STANDARD_IA",
                f"{peer_src}/*",
                "s3://inplace/ckpt/bench/run/step-1/",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        inplace.register("s3://inplace/ckpt/bench/run/step-1")
        up, down = proxy.bytes_up, proxy.bytes_down
        seconds, _ = inplace.move("glacier")
        classes = {
            s3.head_object(Bucket="inplace", Key=f"ckpt/bench/run/step-1/shard-{i:02d}.bin").get(
                "StorageClass"
            )
            for i in range(args.shards)
        }
        results["class_change_in_place"] = {
            "seconds": round(seconds, 2),
            "body_bytes_to_s3": proxy.bytes_up - up,
            "body_bytes_from_s3": proxy.bytes_down - down,
            "classes_after": sorted(c or "STANDARD" for c in classes),
        }
        print(json.dumps(results["class_change_in_place"], indent=2), flush=True)

        # 3. delete N objects
        served = work / "rclone-root"
        for prefix in ("svc", "s5"):
            folder = served / "del" / prefix
            folder.mkdir(parents=True)
            for i in range(args.delete_objects):
                (folder / f"o{i:06d}").write_bytes(b"x")
        with rclone_server(served) as rclone_url:
            storage = S3Storage("del", "", endpoint_url=rclone_url)
            started = time.perf_counter()
            deleted = storage.delete_prefix("svc")
            ours = time.perf_counter() - started
            s5_rclone = [str(BIN / "s5cmd"), "--endpoint-url", rclone_url]
            peer = timed([*s5_rclone, "rm", "s3://del/s5/*"], dict(os.environ))
        left = sum(1 for _ in (served / "del").rglob("o*"))
        results["delete"] = {
            "server": "rclone serve s3",
            "objects": args.delete_objects,
            "deleted": deleted,
            "left_on_server": left,
            "service_s": round(ours, 2),
            "s5cmd_s": round(peer, 2),
            "ratio": round(peer / ours, 2),
        }
        print(json.dumps(results["delete"], indent=2), flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
