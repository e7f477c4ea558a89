"""Import throughput: `POST /v1/imports` of a synthetic tree through the real service, next
to the raw listing of the same tree in the same run, from a local tier and an S3 server.

    .venv/bin/python bench/imports.py            # or: make bench-imports

One tree of `--count` checkpoints (about 10 small files each) and one of `--small-count`
are written once, inside the directory `rclone serve s3` serves, so the local phase
imports them from a local tier and the S3 phase imports the very same files through
rclone. Each import runs on a fresh PostgreSQL database in a fresh `ckpt api` process,
whose peak RSS (VmHWM) shows whether memory follows the tree's size. The trees are
written back to disk before anything is timed, and each is measured `--rounds` times
(peers, then import), one round after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.import_tree import (  # noqa: E402
    S3_ENV,
    Tree,
    build_tree,
    memory_kib,
    process_cpu,
    rclone_s3,
    settle_disk,
    time_find,
    time_s5cmd,
    time_scandir,
)
from bench.register import (  # noqa: E402
    CpuMeter,
    Server,
    TieredServer,
    checkpoint_pg,
    create_database,
    drop_database,
    dsn,
    git_describe,
    machine,
)

BUCKET = "bench"
PREFIX = "ckpt"  # the tiers' root within the bucket (the local tier: that directory)
PROJECT = "imported"
DEFAULT_TIERS = ("hot", "warm", "cold", "archive")
TARGET_RATE = 2000.0  # checkpoints/s
TARGET_RATIO = 2.0  # import time / listing time


def import_server(dbname: str, work: Path, tiers: list[dict[str, Any]], log: Path) -> Server:
    """`ckpt api` with the default policy's tiers (nothing moves there: `ckpt api` runs no
    worker) and the tree's."""
    defaults = [{"name": n, "url": f"file://{work / 'data' / n}"} for n in DEFAULT_TIERS]
    return TieredServer(dbname, work, [*defaults, *tiers], log, env=S3_ENV)


def run_import(
    tiers: list[dict[str, Any]], uri: str, tree: Tree, work: Path, extra_pid: int | None
) -> dict[str, Any]:
    """One import on a fresh database and a fresh server: time from POST to done, peak
    RSS, CPU of the server, PostgreSQL (and `extra_pid`, the S3 server), the checks."""
    dbname = create_database()
    server = import_server(dbname, work, tiers, work / f"server-{dbname}.log")
    try:
        server.wait_healthy()
        checkpoint_pg()
        pid = server.proc.pid
        rss_before = memory_kib(pid)
        meter = CpuMeter(dbname, pid)
        before, extra_before = meter.snapshot(), process_cpu(extra_pid) if extra_pid else 0.0
        started = time.perf_counter()
        status, body = server.request(
            "POST", "/v1/imports", {"uri": uri, "project": PROJECT, "class": "milestone"}
        )
        if status != 202:
            raise RuntimeError(f"POST /v1/imports answered {status}: {body}")
        # split at the last batch's write: listing and registering, then the evaluation.
        # Watched in the database: a GET of the import every 0.1 s would cost the server
        # whose work is timed (`ckpt import` asks every 0.5 s); the record is read once done.
        rss_listing = rss_max = 0
        all_in: float | None = None
        state = "running"
        with psycopg.connect(dsn(dbname), autocommit=True) as watch:
            while state == "running":
                time.sleep(0.1)
                rss = memory_kib(pid)["VmRSS"]
                rss_max = max(rss_max, rss)
                if all_in is None:
                    rss_listing = max(rss_listing, rss)
                found = watch.execute(
                    "SELECT state, registered FROM imports WHERE id = %s", (body["id"],)
                ).fetchone()
                assert found is not None
                state, registered = found
                if all_in is None and registered >= tree.checkpoints:
                    all_in = time.perf_counter() - started
        seconds = time.perf_counter() - started
        status, body = server.request("GET", f"/v1/imports/{body['id']}?limit=1")
        after = meter.snapshot()
        rss_after = memory_kib(pid)
        extra_cpu = (process_cpu(extra_pid) - extra_before) if extra_pid else None
    except BaseException:
        print(f"server log (tail):\n{server.log.read_text()[-4000:]}", file=sys.stderr)
        raise
    finally:
        server.stop()
        drop_database(dbname)
    cpu = CpuMeter.delta(before, after)
    problems = []
    if body["state"] != "done":
        problems.append(f"state {body['state']} ({body.get('error')})")
    for key, expected in (
        ("registered", tree.checkpoints),
        ("discovered", tree.checkpoints),
        ("listed", tree.objects),
        ("runs", tree.runs),
        ("incomplete_count", 0),
    ):
        if body[key] != expected:
            problems.append(f"{key} {body[key]} (expected {expected})")
    return {
        "seconds": round(seconds, 3),
        "checkpoints_per_s": round(tree.checkpoints / seconds, 1),
        "all_registered_s": round(all_in if all_in is not None else seconds, 2),
        "objects_per_s": round(tree.objects / seconds, 1),
        "record": {k: body[k] for k in ("state", "listed", "discovered", "registered", "runs")}
        | {
            "unrecognized": body["unrecognized"],
            "incomplete": body["incomplete_count"],
            "skipped": body["skipped_count"],
            "existing": body["existing"],
            "error": body["error"],
        },
        "rss_mib": {
            "before": round(rss_before["VmRSS"] / 1024, 1),
            "peak_vmhwm": round(rss_after["VmHWM"] / 1024, 1),
            "max_sampled": round(rss_max / 1024, 1),
            "max_sampled_while_listing": round(rss_listing / 1024, 1),
        },
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()}
        | ({"s3_server": round(extra_cpu, 2)} if extra_cpu is not None else {}),
        "check": "ok" if not problems else "FAILED: " + "; ".join(problems),
    }


def phase_local(
    trees: list[Tree], tier_root: Path, work: Path, rounds: int
) -> list[dict[str, Any]]:
    tiers = [{"name": "local", "url": f"file://{tier_root}"}]
    out = []
    for tree in trees:
        for n in range(1, rounds + 1):
            print(f"local, {tree.checkpoints:,} checkpoints, round {n}: listing ...", flush=True)
            find_s, find_lines = time_find(tree.root)
            scan_s, scan_files = time_scandir(tree.root)
            print(f"  find {find_s:.2f} s, scandir {scan_s:.2f} s; importing ...", flush=True)
            result = run_import(tiers, f"file://{tree.root}", tree, work, None)
            listing = {"find": (find_s, find_lines), "os.scandir + stat": (scan_s, scan_files)}
            out.append(_row("local", n, tree, listing, result))
    return out


def phase_s3(trees: list[Tree], served: Path, work: Path, rounds: int) -> list[dict[str, Any]]:
    out = []
    with rclone_s3(served, work / "rclone.log") as (url, pid):
        tiers = [{"name": "s3", "url": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": url}]
        for tree in trees:
            name = tree.root.name
            for n in range(1, rounds + 1):
                print(f"s3, {tree.checkpoints:,} checkpoints, round {n}: listing ...", flush=True)
                ls_s, ls_lines = time_s5cmd(url, f"s3://{BUCKET}/{PREFIX}/{name}/*")
                print(f"  s5cmd ls {ls_s:.2f} s ({ls_lines:,} lines); importing ...", flush=True)
                uri = f"s3://{BUCKET}/{PREFIX}/{name}"
                result = run_import(tiers, uri, tree, work, pid)
                listing = {"s5cmd ls": (ls_s, ls_lines)}
                out.append(_row("s3 (rclone)", n, tree, listing, result))
    return out


def _row(
    phase: str,
    round_: int,
    tree: Tree,
    listing: dict[str, tuple[float, int]],
    result: dict[str, Any],
) -> dict[str, Any]:
    fastest = min(seconds for seconds, _ in listing.values())
    problems = [
        f"{name} saw {lines} objects, not {tree.objects}"
        for name, (_, lines) in listing.items()
        if lines != tree.objects
    ]
    if problems:
        result["check"] = "; ".join([*problems, result["check"]])
    ratio = result["seconds"] / fastest
    ok = result["check"] == "ok"  # the figures of work that did not succeed meet nothing
    return {
        "phase": phase,
        "round": round_,
        "objects": tree.objects,
        "checkpoints": tree.checkpoints,
        "runs": tree.runs,
        "listing": {
            name: {"seconds": round(s, 3), "objects": n, "objects_per_s": round(n / s)}
            for name, (s, n) in listing.items()
        },
        "import": result,
        "ratio_import_to_listing": round(ratio, 2),
        "meets_rate": ok and result["checkpoints_per_s"] >= TARGET_RATE,
        "meets_ratio": ok and ratio <= TARGET_RATIO,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'phase':<12}{'round':>6}{'objects':>10}{'ckpts':>8}  {'listing s (obj/s)':<36}"
        f"{'import s':>9}"
        f"{'ckpt/s':>8}{'ratio':>7}{'RSS MiB':>9}{'CPU s srv/pg':>14}  check"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        listing = ", ".join(
            f"{name.split()[0]} {v['seconds']:.1f} ({v['objects_per_s'] / 1000:.0f}k)"
            for name, v in r["listing"].items()
        )
        imp = r["import"]
        cpu = f"{imp['cpu_s']['server']:.0f}/{imp['cpu_s']['postgres']:.0f}"
        lines.append(
            f"{r['phase']:<12}{r['round']:>6}{r['objects']:>10,}{r['checkpoints']:>8,}"
            f"  {listing:<36}"
            f"{imp['seconds']:>9.1f}{imp['checkpoints_per_s']:>8.0f}"
            f"{r['ratio_import_to_listing']:>7.2f}{imp['rss_mib']['peak_vmhwm']:>9.0f}"
            f"{cpu:>14}  {imp['check'][:40]}"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100_000, help="checkpoints in the tree")
    parser.add_argument(
        "--small-count",
        type=int,
        default=None,
        help="checkpoints in the second, smaller tree (peak RSS beside the large one's); "
        "default count / 10, 0 for none",
    )
    parser.add_argument("--phases", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times the peers and the import are measured on each tree, one round after the "
        "other: how far the same measurement moves within minutes on this machine",
    )
    parser.add_argument(
        "--tmp", type=Path, default=None, help="where to write the trees (default: a temp dir)"
    )
    return parser.parse_args()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, _interrupted)  # the databases are dropped in `finally`
    small = args.count // 10 if args.small_count is None else args.small_count
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.tmp)).resolve()
    served = tmp / "s3root"  # rclone's root: bucket `bench`; the local tier is bench/ckpt
    tier_root = served / BUCKET / PREFIX
    rows: list[dict[str, Any]] = []
    trees: list[Tree] = []
    try:
        for count in sorted({c for c in (small, args.count) if c > 0}):
            print(f"writing a tree of {count:,} checkpoints ...", flush=True)
            tree = build_tree(tier_root / f"tree-{count}", count)
            synced = time.perf_counter()
            settle_disk()
            tree.synced_s = time.perf_counter() - synced
            print(
                f"  {tree.objects:,} objects in {tree.seconds:.1f} s, "
                f"on disk {tree.synced_s:.1f} s later",
                flush=True,
            )
            trees.append(tree)
        if "local" in args.phases:
            rows += phase_local(trees, tier_root, tmp, args.rounds)
        if "s3" in args.phases:
            rows += phase_s3(trees, served, tmp, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(table(rows))
    print()
    for r in rows:
        imp = r["import"]
        print(
            f"{r['phase']}, {r['checkpoints']:,}, round {r['round']}: {imp['check']}; "
            f"record {imp['record']}; "
            f"RSS {imp['rss_mib']}; CPU s {imp['cpu_s']}"
        )
        verdict = "met" if r["meets_rate"] and r["meets_ratio"] else "MISSED"
        print(
            f"  target (>= {TARGET_RATE:.0f} checkpoints/s, import <= {TARGET_RATIO:.0f}x "
            f"listing): {verdict}"
        )
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = out_dir / f"imports-{stamp}.json"
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "git": git_describe(),
        "machine": info,
        "trees": [asdict(t) | {"root": t.root.name} for t in trees],
        "results": rows,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    if not rows or any(r["import"]["check"] != "ok" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
