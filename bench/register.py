"""Registration throughput: the real HTTP service against raw psycopg inserts of the same rows.

Each phase gets a fresh PostgreSQL database. The service phase starts `ckpt api` as a
subprocess and drives POST /v1/runs/{id}/checkpoints from concurrent keep-alive clients;
the raw phase inserts the same checkpoint and location rows, one transaction each.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.types.json import Json

ROOT = Path(__file__).resolve().parents[1]


def this_checkout(env: dict[str, str]) -> dict[str, str]:
    """`env` for a `ckpt` process that runs this checkout's code. The command is the
    virtual environment's, whose editable install points at the checkout it was made in:
    a benchmark run from a second checkout (one build against another) would otherwise
    time the first checkout's service."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}


sys.path.insert(0, str(ROOT))

from app.db.migrate import upgrade  # noqa: E402
from app.domain.ids import new_id  # noqa: E402

PG_HOST = os.environ.get("CKPT_BENCH_PG_HOST", "127.0.0.1")
ADMIN_DSN = f"host={PG_HOST} port=5432 user=postgres dbname=postgres"
PROJECT = "bench"
CLASS = "rolling"
TICK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- results


@dataclass
class Phase:
    """One timed phase: what ran, how long, each latency, each status, CPU spent."""

    name: str
    workers: int | None
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)
    pg_sessions_opened: int = 0
    rows: int = 0
    check: str = ""
    busy_before_pct: float = 0.0
    start_failures: list[str] = field(default_factory=list)
    ledger: dict[str, int] = field(default_factory=dict)
    server_split: list[float] = field(default_factory=list)
    git: str | None = None
    seq_scanned: int = 0  # rows read by sequential scans of checkpoints/locations, timed

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)

        def pct(q: float) -> float:
            return lat[min(n - 1, max(0, math.ceil(q * n) - 1))] * 1000 if n else float("nan")

        return {
            "phase": self.name,
            "workers": self.workers,
            "git": self.git,
            "count": n,
            "seconds": round(self.seconds, 3),
            "rate_per_s": round(n / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": round(pct(0.50), 2),
            "p90_ms": round(pct(0.90), 2),
            "p99_ms": round(pct(0.99), 2),
            "max_ms": round(lat[-1] * 1000, 2) if n else None,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "cpu_ms_per_op": {k: round(v * 1000 / n, 3) for k, v in self.cpu.items()} if n else {},
            "machine_busy_pct": round(self.cpu.get("machine", 0) / self.seconds / _ncpu() * 100, 1)
            if self.seconds
            else None,
            "machine_busy_before_pct": self.busy_before_pct,
            "pg_sessions_opened": self.pg_sessions_opened,
            "server_start_failures": self.start_failures,
            "server_cpu_share_by_process": self.server_split,
            "rows_after": self.rows,
            "seq_scanned_rows_while_timed": self.seq_scanned,
            "ledger_rows_after": self.ledger,
            "check": self.check,
        }


def _ncpu() -> int:
    return len(os.sched_getaffinity(0))


# --------------------------------------------------------------------------- CPU accounting


def _proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _proc_cpu(pid: int) -> float:
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else 0.0


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _proc_stat(int(entry))):
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, []))
    return out


def _machine_busy() -> float:
    """CPU seconds the whole machine spent busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:8]]
    return (sum(values) - values[3] - values[4]) / TICK  # minus idle and iowait


def wait_quiet(max_busy_pct: float, max_wait: float) -> float:
    """Wait (up to `max_wait` s) for a 5 s window in which the machine is at most
    `max_busy_pct` busy, so other work does not share the cores; returns the last reading."""
    deadline = time.monotonic() + max_wait
    while True:
        before = _machine_busy()
        time.sleep(5.0)
        busy = (_machine_busy() - before) / 5.0 / _ncpu() * 100
        if busy <= max_busy_pct or time.monotonic() >= deadline:
            if busy > max_busy_pct:
                print(f"  machine still {busy:.0f}% busy; measuring anyway", flush=True)
            return round(busy, 1)


def _reaped_cpu(pid: int) -> float:
    """CPU seconds of the children `pid` has waited for (cutime and cstime)."""
    fields = _proc_stat(pid)
    return (int(fields[13]) + int(fields[14])) / TICK if fields else 0.0


def _postgres_cpu(postmaster: int) -> float:
    """Every PostgreSQL process, exited backends included (their time lands in the
    postmaster's cutime/cstime when it reaps them)."""
    return _reaped_cpu(postmaster) + sum(_proc_cpu(pid) for pid in _tree(postmaster))


class CpuMeter:
    """CPU seconds of this process, the server process tree, PostgreSQL and the machine."""

    def __init__(self, dbname: str, server_pid: int | None) -> None:
        self.dbname = dbname
        self.server_pid = server_pid
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert backend is not None
            fields = _proc_stat(int(backend[0]))  # read while the backend lives
        if fields is None:
            raise RuntimeError("PostgreSQL must run on this machine (its CPU is measured)")
        self.postmaster = int(fields[1])

    def _sessions(self) -> int:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            row = conn.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = %s", (self.dbname,)
            ).fetchone()
        return int(row[0]) if row else 0

    def snapshot(self) -> dict[str, Any]:
        procs = {p: _proc_cpu(p) for p in _tree(self.server_pid)} if self.server_pid else {}
        return {
            "client": time.process_time(),
            # with the children it has reaped: an import's listing process, say
            "server": sum(procs.values())
            + (_reaped_cpu(self.server_pid) if self.server_pid else 0.0),
            "server_procs": procs,
            "postgres": _postgres_cpu(self.postmaster),
            "machine": _machine_busy(),
            "sessions": self._sessions(),
        }

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        out = {k: after[k] - before[k] for k in ("client", "server", "postgres", "machine")}
        out["other"] = out["machine"] - out["client"] - out["server"] - out["postgres"]
        return out

    @staticmethod
    def split(before: dict[str, Any], after: dict[str, Any]) -> list[float]:
        """Each server process's share of the server's CPU, largest first (worker balance)."""
        used = [v - before["server_procs"].get(p, 0.0) for p, v in after["server_procs"].items()]
        total = sum(used) or 1.0
        return sorted((round(u / total, 3) for u in used if u > 0.01 * total), reverse=True)


# --------------------------------------------------------------------------- database


def _admin(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def create_database() -> str:
    name = f"ckpt_bench_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    upgrade(sqlalchemy_url(name))
    return name


def drop_database(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sqlalchemy_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@{PG_HOST}:5432/{name}"


def dsn(name: str) -> str:
    return f"host={PG_HOST} port=5432 user=postgres dbname={name}"


def checkpoint_pg() -> None:
    """Start every phase from a fresh PostgreSQL checkpoint (fewer full-page writes mid-run)."""
    _admin("CHECKPOINT")


HISTORY_RUN = "run_bench_history"


def preload(name: str, count: int) -> None:
    """`count` checkpoints already in the catalog (with their locations) when a phase
    starts, then ANALYZE, as autovacuum leaves a catalog in use.

    Without them a phase starts from empty tables and grows them tenfold, and the plans its
    connections prepare (psycopg prepares a statement on its fifth use; PostgreSQL then
    keeps one generic plan for it) are made for near-empty tables and kept: in runs without
    this, the service's overlap check scanned the whole `locations` table, or every live
    checkpoint, on most registrations, and its statement cost PostgreSQL 0.65 or 1.9 ms from
    one run to the next. A deployment's catalog is large and analyzed; so is this one."""
    with psycopg.connect(dsn(name), autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO projects (name, created_at) VALUES ('bench-history', now()) RETURNING id"
        ).fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO runs (id, project_id, name, status, labels, started_at) "
            "VALUES (%s, %s, 'history', 'completed', '{}', now())",
            (HISTORY_RUN, row[0]),
        )
        conn.execute(
            "INSERT INTO checkpoints (id, run_id, step, class, state, uri, tier, size_bytes, "
            "files, metrics, labels, pinned, created_at, registered_at, committed_at) "
            "SELECT 'ckpt_history_' || g, %s, g, 'milestone', 'active', "
            "'s3://bench-history/history/step-' || g, 'archive', 1, '[]', '{}', '{}', false, "
            "now(), now(), now() FROM generate_series(1, %s) g",
            (HISTORY_RUN, count),
        )
        conn.execute(
            "INSERT INTO locations (checkpoint_id, tier, uri, storage_class, role) "
            "SELECT id, 'archive', uri, NULL, 'primary' FROM checkpoints WHERE run_id = %s",
            (HISTORY_RUN,),
        )
        conn.execute("ANALYZE")


def scanned_rows(name: str) -> int:
    """Rows read by sequential scans of `checkpoints` and `locations` so far: a registration
    that needs one has a bad plan."""
    with psycopg.connect(dsn(name)) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables "
            "WHERE relname IN ('checkpoints', 'locations')"
        ).fetchone()
    return int(row[0]) if row else 0


def verify(name: str, expected: int, files: int) -> tuple[int, str]:
    """Checkpoint rows against successful registrations; manifests and locations too."""
    with psycopg.connect(dsn(name)) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE json_array_length(files) = %s), "
            "(SELECT count(*) FROM locations l JOIN checkpoints c ON c.id = l.checkpoint_id "
            " WHERE l.role = 'primary' AND c.run_id <> %s) "
            "FROM checkpoints WHERE run_id <> %s",
            (files, HISTORY_RUN, HISTORY_RUN),
        ).fetchone()
    assert row is not None
    total, complete, locations = (int(v) for v in row)
    verdict = "ok" if total == complete == locations == expected else "MISMATCH"
    return total, (
        f"{verdict}: {total} checkpoint rows for {expected} successful registrations, "
        f"{complete} with {files} files, {locations} primary locations"
    )


def ledger_counts(name: str) -> dict[str, int]:
    """Rows in the ledger tables (sweeps, actions) after a phase: evaluations it caused."""
    out: dict[str, int] = {}
    with psycopg.connect(dsn(name)) as conn:
        for table in ("sweeps", "actions"):
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
            if row and row[0]:
                counted = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                out[table] = int(counted[0]) if counted else 0
    return out


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """Registration k goes to run k % runs at step k // runs; one manifest per run."""

    data_dir: Path
    runs: int
    files: int

    def run_name(self, k: int) -> str:
        return f"run-{k % self.runs:03d}"

    def step(self, k: int) -> int:
        return k // self.runs

    def uri(self, k: int) -> str:
        return f"file://{self.data_dir}/hot/{PROJECT}/{self.run_name(k)}/step-{self.step(k)}"

    def manifest(self, run: int) -> list[dict[str, Any]]:
        return [
            {
                "path": f"model-{i:05d}-of-{self.files:05d}.safetensors",
                "size_bytes": 1 << 26 | i,
                "sha256": hashlib.sha256(f"{run}/{i}".encode()).hexdigest(),
            }
            for i in range(self.files)
        ]

    def make_dirs(self, total: int) -> None:
        for k in range(total):
            Path(self.uri(k).removeprefix("file://")).mkdir(parents=True, exist_ok=True)


# --------------------------------------------------------------------------- the service


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """`ckpt api --workers N` as a subprocess in its own process group."""

    def __init__(
        self, dbname: str, data_dir: Path, workers: int, log: Path, *, auth: bool = False
    ) -> None:
        self.port = free_port()
        # with auth on, the admin token its setup requests send (seeded at start)
        self.admin = f"bench-admin-{uuid.uuid4().hex}" if auth else None
        env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
        env.update(
            CKPT_DATABASE_URL=sqlalchemy_url(dbname),
            CKPT_DATA_DIR=str(data_dir),
            CKPT_AUTH="on" if auth else "off",
            CKPT_HOST="127.0.0.1",
            CKPT_PORT=str(self.port),
        )
        if self.admin is not None:
            env["CKPT_BOOTSTRAP_TOKEN"] = self.admin
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "ckpt"), "api", "--workers", str(workers)],
                cwd=ROOT,
                env=this_checkout(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if payload else {}
            if self.admin is not None:
                headers["Authorization"] = f"Bearer {self.admin}"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class TieredServer(Server):
    """`ckpt api` (one process, auth off) with a tiers file of `tiers`, logging to `log`;
    `env` is added to its environment (an S3 server's credentials)."""

    def __init__(
        self,
        dbname: str,
        work: Path,
        tiers: list[dict[str, Any]],
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.admin = None  # auth off: requests carry no token
        (work / "tiers.yaml").write_text(yaml.safe_dump({"tiers": tiers}))
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "AWS_"))}
        environ.update(
            env or {},
            CKPT_DATABASE_URL=sqlalchemy_url(dbname),
            CKPT_DATA_DIR=str(work / "data"),
            CKPT_TIERS_FILE=str(work / "tiers.yaml"),
            CKPT_AUTH="off",
            CKPT_HOST="127.0.0.1",
            CKPT_PORT=str(self.port),
        )
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "ckpt"), "api"],
                cwd=ROOT,
                env=this_checkout(environ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def start_server(
    dbname: str, data_dir: Path, workers: int, tmp: Path, phase: Phase, *, auth: bool
) -> Server:
    """Start the server and let every worker finish start-up (one failing stops them all);
    a failed start is retried twice and recorded, with the log line that says why."""
    for attempt in range(1, 4):
        server = Server(
            dbname, data_dir, workers, tmp / f"server-w{workers}-{attempt}.log", auth=auth
        )
        try:
            server.wait_healthy()
            time.sleep(3.0)
            if server.proc.poll() is None and server.request("GET", "/healthz")[0] == 200:
                return server
        except (OSError, RuntimeError):
            pass
        server.stop()
        log = server.log.read_text()
        lines = [ln for ln in log.splitlines() if "Error" in ln or "failed" in ln]
        phase.start_failures.append(" | ".join(lines[-2:]) or log[-300:])
        print(f"  server start {attempt} failed: {phase.start_failures[-1]}", flush=True)
    raise RuntimeError(f"the server did not start:\n{server.log.read_text()[-3000:]}")


def _content_length(head: bytes) -> int:
    start = head.lower().find(b"\r\ncontent-length:")
    if start < 0:
        raise RuntimeError(f"response without content-length: {head!r}")
    end = head.index(b"\r\n", start + 2)
    return int(head[start + 17 : end])


async def _raw_clients(
    port: int,
    clients: int,
    jobs: Iterator[int],
    request: Callable[[int], bytes],
    phase: Phase,
    on_start: Callable[[], None],
) -> None:
    """Keep-alive HTTP/1.1 connections, opened one by one so that each server worker
    accepts its share (opened at once, the first worker to wake accepts them all)."""
    conns = []
    try:
        for _ in range(clients):
            conns.append(await asyncio.open_connection("127.0.0.1", port))
            await asyncio.sleep(0.01)
        on_start()
        await asyncio.gather(
            *(_exchange(reader, writer, jobs, request, phase) for reader, writer in conns)
        )
    finally:
        for _, writer in conns:
            writer.close()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    jobs: Iterator[int],
    request: Callable[[int], bytes],
    phase: Phase,
) -> None:
    """Write a prebuilt request, read the head and the body; repeat."""
    for k in jobs:
        data = request(k)
        start = time.perf_counter()
        writer.write(data)
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(_content_length(head))
        phase.latencies.append(time.perf_counter() - start)
        phase.statuses[head[9:12].decode()] += 1


async def _aiohttp_clients(
    port: int,
    clients: int,
    jobs: Iterator[int],
    request: Callable[[int], bytes],
    phase: Phase,
    on_start: Callable[[], None],
) -> None:
    """The same exchange through aiohttp (its connections open on demand)."""
    import aiohttp

    async def one(session: aiohttp.ClientSession) -> None:
        for k in jobs:
            head, _, body = request(k).partition(b"\r\n\r\n")
            first, *lines = head.decode().split("\r\n")
            path = first.split(" ", 2)[1]
            sent = dict(line.split(": ", 1) for line in lines)
            token = {"Authorization": sent["Authorization"]} if "Authorization" in sent else {}
            start = time.perf_counter()
            url = f"http://127.0.0.1:{port}{path}"
            async with session.post(url, data=body, headers=token) as response:
                await response.read()
            phase.latencies.append(time.perf_counter() - start)
            phase.statuses[str(response.status)] += 1

    connector = aiohttp.TCPConnector(limit=clients)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        on_start()
        await asyncio.gather(*(one(session) for _ in range(clients)))


def drive_http(
    port: int,
    clients: int,
    jobs: range,
    request: Callable[[int], bytes],
    phase: Phase,
    kind: str,
    on_start: Callable[[], None] = lambda: None,
) -> None:
    """Run `jobs` through `clients` concurrent connections sharing one iterator;
    `on_start` runs once the connections are open, just before the first request."""
    shared = iter(jobs)
    clients_of = _aiohttp_clients if kind == "aiohttp" else _raw_clients
    main = clients_of(port, clients, shared, request, phase, on_start)
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:
        asyncio.run(main)


def bench_service(args: argparse.Namespace, work: Workload, workers: int, tmp: Path) -> Phase:
    """One service phase on its own fresh database, dropped afterwards."""
    dbname = create_database()
    try:
        preload(dbname, args.catalog)
        return _measure_service(args, work, workers, tmp, dbname)
    finally:
        drop_database(dbname)


def _measure_service(
    args: argparse.Namespace, work: Workload, workers: int, tmp: Path, dbname: str
) -> Phase:
    phase = Phase(f"service ({args.client})", workers, git=git_describe())
    auth = args.auth == "on"
    server = start_server(dbname, work.data_dir, workers, tmp, phase, auth=auth)
    try:
        bearer = ""
        if auth:  # what a training job holds: a register token for its project
            status, body = server.request(
                "POST",
                "/v1/tokens",
                {"name": "bench-jobs", "scopes": ["register"], "projects": [PROJECT]},
            )
            assert status == 201, (status, body)
            bearer = f"Authorization: Bearer {body['token']}\r\n"
        run_ids = []
        for r in range(work.runs):
            status, body = server.request(
                "POST", "/v1/runs", {"project": PROJECT, "name": work.run_name(r)}
            )
            assert status == 201, (status, body)
            run_ids.append(body["id"])
        manifests = [json.dumps(work.manifest(r), separators=(",", ":")) for r in range(work.runs)]

        def request(k: int) -> bytes:
            body = (
                f'{{"step":{work.step(k)},"class":"{CLASS}","uri":{json.dumps(work.uri(k))},'
                f'"files":{manifests[k % work.runs]}}}'
            ).encode()
            head = (
                f"POST /v1/runs/{run_ids[k % work.runs]}/checkpoints HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
                f"{bearer}Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            return head + body

        checkpoint_pg()
        phase.busy_before_pct = wait_quiet(args.quiet_pct, args.quiet_wait)
        warm = Phase("warm-up", workers)
        drive_http(server.port, args.clients, range(args.warmup), request, warm, args.client)
        meter = CpuMeter(dbname, server.proc.pid)
        marks: dict[str, Any] = {}

        def started() -> None:
            marks["scanned"] = scanned_rows(dbname)
            marks["before"] = meter.snapshot()
            marks["start"] = time.perf_counter()

        jobs = range(args.warmup, args.warmup + args.count)
        drive_http(server.port, args.clients, jobs, request, phase, args.client, started)
        phase.seconds = time.perf_counter() - marks["start"]
        after = meter.snapshot()
        before = marks["before"]
        phase.cpu = CpuMeter.delta(before, after)
        phase.server_split = CpuMeter.split(before, after)
        phase.seq_scanned = scanned_rows(dbname) - marks["scanned"]
        phase.pg_sessions_opened = int(after["sessions"] - before["sessions"])
    except BaseException:
        print(f"server log (tail):\n{server.log.read_text()[-4000:]}", file=sys.stderr)
        if (code := server.proc.poll()) is not None:
            print(f"the server exited during the phase (status {code})", file=sys.stderr)
        raise
    finally:
        server.stop()
    good = warm.statuses["201"] + phase.statuses["201"]
    phase.statuses.update({f"warm-up {k}": v for k, v in warm.statuses.items() if k != "201"})
    phase.rows, phase.check = verify(dbname, good, work.files)
    phase.ledger = ledger_counts(dbname)
    if failed := sum(v for k, v in phase.statuses.items() if k != "201"):
        phase.check = f"FAILED: {failed} responses were not 201; {phase.check}"
    return phase


# --------------------------------------------------------------------------- the raw peer

INSERT_CHECKPOINT = """
INSERT INTO checkpoints (id, run_id, step, class, state, uri, tier, size_bytes, files,
    metrics, labels, pinned, created_at, registered_at, committed_at)
VALUES (%s, %s, %s, %s, 'active', %s, 'hot', %s, %s, %s, %s, false, %s, %s, %s)
ON CONFLICT DO NOTHING RETURNING id
"""
INSERT_LOCATION = """
INSERT INTO locations (checkpoint_id, tier, uri, storage_class, role)
VALUES (%s, 'hot', %s, NULL, 'primary') ON CONFLICT DO NOTHING
"""


def _raw_worker(
    conn: psycopg.Connection[Any],
    jobs: Iterator[int],
    row: Callable[[int], tuple[Any, ...]],
    phase: Phase,
) -> None:
    """One connection, one transaction per registration: checkpoint row, location row."""
    latencies: list[float] = []
    failures = 0
    for k in jobs:  # a shared range iterator: next() is atomic under the GIL
        params = row(k)
        start = time.perf_counter()
        try:
            inserted = conn.execute(INSERT_CHECKPOINT, params).fetchone()
            conn.execute(INSERT_LOCATION, (params[0], params[4]))
            conn.commit()
        except psycopg.Error:
            conn.rollback()
            failures += 1
            continue
        if inserted is None:
            failures += 1
            continue
        latencies.append(time.perf_counter() - start)
    phase.latencies.extend(latencies)
    phase.statuses.update({"ok": len(latencies), "failed": failures})


def drive_raw(
    conns: list[psycopg.Connection[Any]],
    jobs: range,
    row: Callable[[int], tuple[Any, ...]],
    phase: Phase,
) -> None:
    """Run `jobs` through one thread per connection."""
    shared = iter(jobs)
    threads = [
        threading.Thread(target=_raw_worker, args=(conn, shared, row, phase)) for conn in conns
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_raw(args: argparse.Namespace, work: Workload) -> Phase:
    """The peer on its own fresh database, dropped afterwards."""
    dbname = create_database()
    phase = Phase("raw psycopg", None)
    try:
        preload(dbname, args.catalog)
        now = datetime.now(UTC)
        with psycopg.connect(dsn(dbname)) as conn:
            project = conn.execute(
                "INSERT INTO projects (name, created_at) VALUES (%s, %s) RETURNING id",
                (PROJECT, now),
            ).fetchone()
            assert project is not None
            project_id = project[0]
            run_ids = []
            for r in range(work.runs):
                run_ids.append(new_id("run"))
                conn.execute(
                    "INSERT INTO runs (id, project_id, name, status, labels, started_at) "
                    "VALUES (%s, %s, %s, 'active', '{}', %s)",
                    (run_ids[-1], project_id, work.run_name(r), now),
                )
        manifests = [work.manifest(r) for r in range(work.runs)]
        sizes = [sum(f["size_bytes"] for f in m) for m in manifests]

        def row(k: int) -> tuple[Any, ...]:
            r = k % work.runs
            at = datetime.now(UTC)
            files = Json(manifests[r])
            return (
                new_id("ckpt"),
                run_ids[r],
                work.step(k),
                CLASS,
                work.uri(k),
                sizes[r],
                files,
                Json({}),
                Json({}),
                at,
                at,
                at,
            )

        checkpoint_pg()
        phase.busy_before_pct = wait_quiet(args.quiet_pct, args.quiet_wait)
        conns = [psycopg.connect(dsn(dbname)) for _ in range(args.clients)]
        try:
            warm = Phase("warm-up", None)
            drive_raw(conns, range(args.warmup), row, warm)
            meter = CpuMeter(dbname, None)
            scanned = scanned_rows(dbname)
            before = meter.snapshot()
            start = time.perf_counter()
            drive_raw(conns, range(args.warmup, args.warmup + args.count), row, phase)
            phase.seconds = time.perf_counter() - start
            after = meter.snapshot()
            phase.seq_scanned = scanned_rows(dbname) - scanned
        finally:
            for conn in conns:
                conn.close()
        phase.cpu = CpuMeter.delta(before, after)
        phase.pg_sessions_opened = int(after["sessions"] - before["sessions"])
        good = warm.statuses["ok"] + phase.statuses["ok"]
        phase.rows, phase.check = verify(dbname, good, work.files)
        if failed := warm.statuses["failed"] + phase.statuses["failed"]:
            phase.check = f"FAILED: {failed} transactions failed; {phase.check}"
    finally:
        drop_database(dbname)
    return phase


# --------------------------------------------------------------------------- report


def git_describe() -> str | None:
    """The code under test: commit, and `-dirty` when the working tree differs from it."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    with psycopg.connect(ADMIN_DSN) as conn:
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
                "'synchronous_commit', 'fsync', 'shared_buffers', 'max_connections')"
            ).fetchall()
        )
    return {
        "nproc": _ncpu(),
        "cpu": model,
        "ram_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "postgresql": settings,
        "loadavg_at_start": os.getloadavg(),
    }


def table(summaries: list[dict[str, Any]]) -> str:
    head = (
        f"{'phase':<16}{'workers':>8}{'count':>7}{'reg/s':>7}{'p50 ms':>8}{'p90 ms':>8}"
        f"{'p99 ms':>8}{'max ms':>8}  {'CPU ms/reg: client server pg other = total':<44}busy%"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        cpu = s["cpu_ms_per_op"]
        split = " ".join(f"{cpu[k]:6.2f}" for k in ("client", "server", "postgres", "other"))
        lines.append(
            f"{s['phase']:<16}{s['workers'] or '-':>8}{s['count']:>7}{s['rate_per_s']:>7.0f}"
            f"{s['p50_ms']:>8.1f}{s['p90_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['max_ms']:>8.1f}"
            f"  {split} = {cpu['machine']:5.2f}{'':>9}{s['machine_busy_pct']:>5}"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20_000, help="timed registrations")
    parser.add_argument("--warmup", type=int, default=2_000, help="untimed registrations first")
    parser.add_argument("--clients", type=int, default=32, help="concurrent connections")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="uvicorn worker processes; one service phase per value",
    )
    parser.add_argument("--files", type=int, default=64, help="manifest entries per checkpoint")
    parser.add_argument("--runs", type=int, default=32, help="runs the registrations spread over")
    parser.add_argument(
        "--client",
        choices=["raw", "aiohttp"],
        default="raw",
        help="HTTP client: minimal keep-alive HTTP/1.1 (default) or aiohttp",
    )
    parser.add_argument(
        "--quiet-pct",
        type=float,
        default=10.0,
        help="before each phase, wait for the machine to be at most this %% busy",
    )
    parser.add_argument(
        "--quiet-wait", type=float, default=300.0, help="longest wait for quiet, seconds"
    )
    parser.add_argument(
        "--auth",
        choices=["on", "off"],
        default="on",
        help="access control: each registration sends a register token for its project",
    )
    parser.add_argument(
        "--catalog",
        type=int,
        default=100_000,
        help="checkpoints already catalogued (and analyzed) when each phase starts",
    )
    parser.add_argument("--skip-raw", action="store_true", help="leave out the raw peer")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-")).resolve()
    work = Workload(data_dir=tmp / "data", runs=args.runs, files=args.files)
    phases: list[Phase] = []
    try:
        work.make_dirs(args.warmup + args.count)
        for workers in args.workers:
            print(f"service, {workers} worker(s) ...", flush=True)
            phases.append(bench_service(args, work, workers, tmp))
        if not args.skip_raw:
            print("raw psycopg peer ...", flush=True)
            phases.append(bench_raw(args, work))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summaries = [p.summary() for p in phases]
    raw = next((s for s in summaries if s["phase"] == "raw psycopg"), None)
    for s in summaries:
        if raw and s is not raw:
            s["ratio_to_raw"] = round(s["rate_per_s"] / raw["rate_per_s"], 3)
        if s["workers"] and raw:  # DESIGN section 9
            floor = 0.5 * raw["rate_per_s"] if s["workers"] == 1 else 1000.0
            s["target"] = f">= {floor:.0f}/s, p99 <= {1.5 * raw['p99_ms']:.1f} ms"
            s["meets_target"] = s["rate_per_s"] >= floor and s["p99_ms"] <= 1.5 * raw["p99_ms"]
    print()
    print(table(summaries))
    print()
    for s in summaries:
        name = f"{s['phase']}, {s['workers']} worker(s)" if s["workers"] else s["phase"]
        print(f"{name}: {s['check']}; statuses {s['statuses']}")
        if s["git"]:
            print(f"  code: {s['git']}")
        if "ratio_to_raw" in s:
            verdict = "met" if s["meets_target"] else "MISSED"
            print(f"  service/raw {s['ratio_to_raw']:.3f}; target ({s['target']}) {verdict}")
        if s["ledger_rows_after"]:
            print(f"  ledger rows after the phase: {s['ledger_rows_after']}")
        print(f"  PostgreSQL sessions opened while timed: {s['pg_sessions_opened']}")
        print(f"  rows read by sequential scans while timed: {s['seq_scanned_rows_while_timed']}")
        if len(s["server_cpu_share_by_process"]) > 1:
            print(f"  server CPU share by process: {s['server_cpu_share_by_process']}")
        for failure in s["server_start_failures"]:
            print(f"  a server start failed: {failure}")
        cpu = s["cpu_ms_per_op"]
        if cpu and cpu["other"] > 0.15 * cpu["machine"]:
            print(f"  DISTURBED: other processes used {cpu['other']:.2f} ms CPU per registration")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = out_dir / f"register-{stamp}.json"
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "args": vars(args),
        "machine": info,
        "results": summaries,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    if any(not s["check"].startswith("ok") for s in summaries):
        sys.exit(1)


if __name__ == "__main__":
    main()
