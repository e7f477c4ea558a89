"""What the Python client costs a training job: registrations through `ckpt_client` beside
the same calls through a bare `httpx.Client`, and a reservation's round trip (reserve, then
commit) through both, against one `ckpt api` on PostgreSQL.

A training loop registers from one thread, one call at a time, so every peer here is
sequential and the figure that matters is the latency of one call. The peers alternate in
blocks on the same service and database, so a noisy neighbour hits both alike; the client's
overhead is the difference of the medians, and the ratio of the rates.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.register import (  # noqa: E402
    Phase,
    Server,
    checkpoint_pg,
    create_database,
    drop_database,
    dsn,
    git_describe,
    machine,
    wait_quiet,
)
from ckpt_client import Client, Run  # noqa: E402

PROJECT = "bench"
# The peers: registration through httpx and through the client, reserve + commit likewise.
PEERS = ("register/httpx", "register/client", "reserve+commit/httpx", "reserve+commit/client")


class Bench:
    """One service, one run per peer, steps handed out in order; every call timed."""

    def __init__(self, server: Server, data_dir: Path, files: int) -> None:
        self.url = f"http://127.0.0.1:{server.port}"
        self.data_dir = data_dir
        self.manifest = [
            {"path": f"shard-{i:05d}.safetensors", "size_bytes": 1 << 26 | i} for i in range(files)
        ]
        self.http = httpx.Client(base_url=self.url, timeout=30.0)
        self.client = Client(self.url, token="", deadline=30.0, on_unavailable="raise")
        self.runs: dict[str, Run] = {
            peer: self.client.run(PROJECT, peer.replace("/", "-").replace("+", "-"))
            for peer in PEERS
        }
        self.next_step = dict.fromkeys(PEERS, 0)
        self.phases = {peer: Phase(name=peer, workers=1) for peer in PEERS}

    def close(self) -> None:
        self.http.close()
        self.client.close()

    def uri(self, peer: str, step: int) -> str:
        run = self.runs[peer]
        path = self.data_dir / "hot" / PROJECT / run.name / f"step-{step}"
        path.mkdir(parents=True, exist_ok=True)
        return f"file://{path}"

    def _post(self, path: str, body: dict[str, Any]) -> int:
        response = self.http.post(path, json=body)
        response.raise_for_status()
        return response.status_code

    def call(self, peer: str) -> Callable[[], str]:
        """The next call of `peer`, its uri made ready outside the timing."""
        step = self.next_step[peer]
        self.next_step[peer] += 1
        run, uri = self.runs[peer], self.uri(peer, step)
        body = {"step": step, "class": "rolling", "uri": uri}
        if peer == "register/httpx":
            return lambda: str(
                self._post(f"/v1/runs/{run.id}/checkpoints", {**body, "files": self.manifest})
            )
        if peer == "register/client":

            def register() -> str:
                checkpoint = run.register(step, uri, files=self.manifest)
                assert checkpoint is not None
                return checkpoint.state

            return register
        if peer == "reserve+commit/httpx":

            def raw_round_trip() -> str:
                response = self.http.post(
                    f"/v1/runs/{run.id}/checkpoints", json={**body, "committed": False}
                )
                response.raise_for_status()
                checkpoint_id = response.json()["id"]
                return str(
                    self._post(f"/v1/checkpoints/{checkpoint_id}/commit", {"files": self.manifest})
                )

            return raw_round_trip

        def round_trip() -> str:
            with run.reserve(step, uri) as pending:
                committed = pending.commit(files=self.manifest)
            assert committed is not None
            return committed.state

        return round_trip

    def block(self, peer: str, count: int) -> None:
        phase = self.phases[peer]
        for _ in range(count):
            call = self.call(peer)
            started = time.perf_counter()
            outcome = call()
            elapsed = time.perf_counter() - started
            phase.latencies.append(elapsed)
            phase.seconds += elapsed
            phase.statuses[outcome] += 1


def verify(dbname: str, bench: Bench, files: int) -> dict[str, str]:
    """Every timed call left one active checkpoint with the whole manifest, no reservation
    left writing, and nothing else in its run."""
    checks: dict[str, str] = {}
    with psycopg.connect(dsn(dbname)) as conn:
        for peer, run in bench.runs.items():
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE state = 'active' "
                "AND json_array_length(files) = %s), count(*) FILTER (WHERE state = 'writing') "
                "FROM checkpoints WHERE run_id = %s",
                (files, run.id),
            ).fetchone()
            assert row is not None
            total, complete, writing = (int(v) for v in row)
            expected = bench.next_step[peer]
            verdict = "ok" if total == complete == expected and writing == 0 else "MISMATCH"
            checks[peer] = (
                f"{verdict}: {total} rows for {expected} calls, {complete} active"
                f" with {files} files, {writing} writing"
            )
    return checks


def report(bench: Bench) -> list[dict[str, Any]]:
    rows = []
    for peer in PEERS:
        summary = bench.phases[peer].summary()
        mean_ms = 1000 * bench.phases[peer].seconds / max(1, summary["count"])
        rows.append({**summary, "mean_ms": round(mean_ms, 3)})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'peer':<24}{'calls':>7}{'per s':>8}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for row in rows:
        print(
            f"{row['phase']:<24}{row['count']:>7}{row['rate_per_s']:>8}"
            f"{row['p50_ms']:>9}{row['p99_ms']:>9}{row['mean_ms']:>9}"
        )
    by = {row["phase"]: row for row in rows}
    for kind in ("register", "reserve+commit"):
        raw, client = by[f"{kind}/httpx"], by[f"{kind}/client"]
        print(
            f"{kind}: client overhead {client['p50_ms'] - raw['p50_ms']:+.2f} ms at p50, "
            f"{client['mean_ms'] - raw['mean_ms']:+.2f} ms mean; "
            f"rate ratio client/httpx {client['rate_per_s'] / raw['rate_per_s']:.3f}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--count", type=int, default=3000, help="timed calls per peer")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks per peer")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls per peer first")
    parser.add_argument("--files", type=int, default=64, help="manifest entries per checkpoint")
    parser.add_argument("--quiet-pct", type=float, default=10.0)
    parser.add_argument("--quiet-wait", type=float, default=120.0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-client-")).resolve()
    dbname = create_database()
    server = Server(dbname, tmp / "data", 1, tmp / "server.log")
    try:
        server.wait_healthy()
        bench = Bench(server, tmp / "data", args.files)
        try:
            for peer in PEERS:
                bench.block(peer, args.warmup)
            for phase in bench.phases.values():
                phase.latencies.clear()
                phase.seconds = 0.0
            checkpoint_pg()
            busy = wait_quiet(args.quiet_pct, args.quiet_wait)
            per_block = max(1, args.count // args.blocks)
            for _ in range(args.blocks):
                for peer in PEERS:
                    bench.block(peer, per_block)
            checks = verify(dbname, bench, args.files)
            rows = report(bench)
        finally:
            bench.close()
    finally:
        server.stop()
        drop_database(dbname)
    for row in rows:
        row["check"] = checks[row["phase"]]
    print_table(rows)
    for peer, check in checks.items():
        print(f"  {peer}: {check}")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"client-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(
        json.dumps(
            {
                "machine": info,
                "git": git_describe(),
                "busy_before_pct": busy,
                "args": vars(args),
                "peers": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out.relative_to(ROOT)}")
    if any(not check.startswith("ok") for check in checks.values()):
        sys.exit("a check failed: the figures above are not of work that succeeded")


if __name__ == "__main__":
    main()
