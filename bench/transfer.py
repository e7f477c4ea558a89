"""Transfers against peers on the same local S3 server, in one run.

    .venv/bin/python bench/transfer.py            # or: make bench-transfer

1. Moves of a 2 GiB checkpoint of 16 shards, then of one 2 GiB object (`--big-gib`),
   local -> S3 and S3 -> S3 (another bucket), each a real ledger action planned by
   `ckpt sweep` and executed by `ckpt worker --once`, against `s5cmd cp` and `rclone copy`
   of the same files (S3 -> S3 also `s5cmd mv` and `rclone move`, which remove the source
   as the service does), on `rclone serve s3` (`--server moto` for moto instead). The
   service's time is the transfer's own, from claim to `done` (copy, verification, catalog
   switch and source removal, each reported), as a long-lived worker spends it; the
   process's whole run and an idle worker's start-up are reported beside it. Every move
   must end `done` with the checkpoint on its target alone, and every peer's copy must
   hold every byte, or the benchmark fails.
2. A class change in place (two tiers on one bucket prefix), on moto, which keeps storage
   classes: the bytes that pass through the worker, counted by a proxy between the worker
   and the S3 server (request and response bodies), not assumed.
3. Delete 100,000 objects: the S3 adapter's delete_prefix against `s5cmd rm`, both on one
   `rclone serve s3` server, whose buckets are directories: the objects are written
   straight to disk (moto takes about 10 ms a PUT, so filling it would take the hour).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.storage.limits import S3_MAX_SINGLE_COPY
from app.storage.s3 import S3Storage
from bench.import_tree import memory_kib, rclone_s3, settle_disk
from bench.transfer_parts import (
    BIN,
    ENV,
    ROOT,
    CountingProxy,
    MiB,
    Moved,
    Service,
    moto_server,
    timed,
)


def make_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MiB)
    with open(path, "wb") as out:
        for _ in range(size // MiB):
            out.write(block)


def stored(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Object name (under `prefix`) -> size."""
    found: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            found[item["Key"].removeprefix(prefix).lstrip("/")] = item["Size"]
    return found


def empty(s3: Any, bucket: str) -> None:
    for key in stored(s3, bucket, ""):
        s3.delete_object(Bucket=bucket, Key=key)


def move_case(
    s3: Any,
    s3_url: str,
    service: Service,
    checkpoint_id: str,
    local: Path,
    files: dict[str, int],
    *,
    s3_to_s3: bool = True,
) -> dict[str, Any]:
    """The service's moves of one checkpoint (local -> S3, then S3 -> S3 unless told not
    to), then each peer's copies of the same files (`local`: a file or a directory) and,
    S3 -> S3, its move of them, every result checked."""
    targets = ("s3a", "s3b") if s3_to_s3 else ("s3a",)
    service_moves: list[Moved] = [service.move(checkpoint_id, t) for t in targets]
    rclone_env = {
        **os.environ,
        "RCLONE_CONFIG_SRV_TYPE": "s3",
        "RCLONE_CONFIG_SRV_PROVIDER": "Other",
        "RCLONE_CONFIG_SRV_ENDPOINT": s3_url,
        "RCLONE_CONFIG_SRV_ACCESS_KEY_ID": ENV["AWS_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_SRV_SECRET_ACCESS_KEY": ENV["AWS_SECRET_ACCESS_KEY"],
    }
    s5 = [str(BIN / "s5cmd"), "--endpoint-url", s3_url]
    rclone = [str(BIN / "rclone")]
    if local.is_dir():
        s5_cmds = (
            [*s5, "cp", f"{local}/*", "s3://s5-a/ckpt/"],
            [*s5, "cp", "s3://s5-a/ckpt/*", "s3://s5-b/ckpt/"],
            [*s5, "mv", "s3://s5-a/ckpt/*", "s3://s5-b/ckpt/"],
        )
        rclone_cmds = (
            [*rclone, "copy", str(local), "srv:rc-a/ckpt"],
            [*rclone, "copy", "srv:rc-a/ckpt", "srv:rc-b/ckpt"],
            [*rclone, "move", "srv:rc-a/ckpt", "srv:rc-b/ckpt"],
        )
    else:
        name = local.name
        s5_cmds = (
            [*s5, "cp", str(local), f"s3://s5-a/ckpt/{name}"],
            [*s5, "cp", f"s3://s5-a/ckpt/{name}", f"s3://s5-b/ckpt/{name}"],
            [*s5, "mv", f"s3://s5-a/ckpt/{name}", f"s3://s5-b/ckpt/{name}"],
        )
        rclone_cmds = (
            [*rclone, "copyto", str(local), f"srv:rc-a/ckpt/{name}"],
            [*rclone, "copyto", f"srv:rc-a/ckpt/{name}", f"srv:rc-b/ckpt/{name}"],
            [*rclone, "moveto", f"srv:rc-a/ckpt/{name}", f"srv:rc-b/ckpt/{name}"],
        )
    peers: dict[str, list[float]] = {}
    peer_moves: dict[str, float] = {}
    for peer, (first, second, move), env, prefix in (
        ("s5cmd", s5_cmds, dict(os.environ), "s5"),
        ("rclone", rclone_cmds, rclone_env, "rc"),
    ):
        a, b = f"{prefix}-a", f"{prefix}-b"
        peers[peer] = [timed(first, env)] + ([timed(second, env)] if s3_to_s3 else [])
        for bucket in (a, b)[: len(targets)]:
            if stored(s3, bucket, "ckpt") != files:
                raise SystemExit(f"{peer} left {bucket} incomplete")
            empty(s3, bucket)
        if s3_to_s3:
            # the service's work: the source removed once copied. Timed where the copy
            # was, right after the files' upload (a source read once already copies faster)
            timed(first, env)
            peer_moves[peer] = timed(move, env)
            if stored(s3, b, "ckpt") != files or stored(s3, a, "ckpt"):
                raise SystemExit(f"{peer}'s move left {b} incomplete or {a} not empty")
            empty(s3, b)
    best = [min(p[i] for p in peers.values()) for i in range(len(targets))]
    result: dict[str, Any] = {"peers_s": peers}
    if peer_moves:
        result["peer_moves_s"] = {k: round(v, 2) for k, v in peer_moves.items()}
    total = sum(files.values())
    for i, label in enumerate(("local_to_s3", "s3_to_s3")[: len(targets)]):
        moved = service_moves[i]
        warm = moved.phases["total_s"]
        against_moves: dict[str, float] = {}
        if label == "s3_to_s3":
            best_move = min(peer_moves.values())
            against_moves = {
                "best_peer_move_s": round(best_move, 2),
                "ratio_to_peer_move": round(best_move / warm, 2),
            }
        result[label] = {
            "service_s": warm,
            "phases_s": {k: v for k, v in moved.phases.items() if k != "total_s"},
            "worker_process_s": round(moved.process_s, 2),
            "service_MiB_s": round(total / MiB / warm, 1),
            "best_peer_s": round(best[i], 2),
            "ratio": round(best[i] / warm, 2),
            "ratio_whole_process": round(best[i] / moved.process_s, 2),
            **against_moves,
            "worker_peak_rss_MiB": round(moved.peak_rss / MiB, 1),
        }
    return result


MOVE_BUCKETS = ("svc-a", "svc-b", "s5-a", "s5-b", "rc-a", "rc-b")


@contextmanager
def move_server(kind: str, work: Path) -> Iterator[tuple[str, int | None]]:
    """The S3 server the moves are timed on, its buckets made: (url, pid when known).

    `rclone serve s3` (Go) writes objects to disk as they come and copies server-side on
    CopyObject; it runs without ETags on HEAD (see `rclone_s3`). moto (Python) holds a
    multipart object in memory while completing it (about 3x its size) and spends about
    1.5x the worker's CPU, on the same two cores: the peers, which send less, lose less
    to it."""
    if kind == "moto":
        with moto_server() as url:
            s3 = boto3.client("s3", endpoint_url=url)
            for bucket in MOVE_BUCKETS:
                s3.create_bucket(Bucket=bucket)
            yield url, None
        return
    root = work / "rclone-moves"
    for bucket in MOVE_BUCKETS:
        (root / bucket).mkdir(parents=True)
    with rclone_s3(root, work / "rclone-moves.log", etag=False) as (url, pid):
        yield url, pid


def s3_tier(name: str, bucket: str, url: str, klass: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "url": f"s3://{bucket}/ckpt", "endpoint_url": url}
    return {**out, "storage_class": klass} if klass else out


def moves(
    args: argparse.Namespace,
    work: Path,
    hot: Path,
    source: Path,
    peer_src: Path,
    files: dict[str, int],
    s3_url: str,
) -> dict[str, Any]:
    """1. The sixteen shards, then the one large object, each moved local -> S3 and
    S3 -> S3 by the service and copied by the peers."""
    s3 = boto3.client("s3", endpoint_url=s3_url)
    service = Service(
        work / "svc",
        [
            {"name": "hot", "url": f"file://{hot}"},
            s3_tier("s3a", "svc-a", s3_url),
            s3_tier("s3b", "svc-b", s3_url),
        ],
    )
    out: dict[str, Any] = {"worker_startup_s": round(service.ckpt("worker", "--once")[0], 2)}
    shards_id = service.register(f"file://{source}")
    out["shards"] = {
        "checkpoint": f"{args.shards} x {args.shard_mib} MiB",
        **move_case(s3, s3_url, service, shards_id, peer_src, files),
    }
    print(json.dumps(out["shards"], indent=2), flush=True)
    if not args.big_gib:
        return out
    big = hot / "bench" / "big" / "model.ckpt"
    make_file(big, args.big_gib * 1024 * MiB)
    peer_big = work / "peer-big" / "model.ckpt"
    peer_big.parent.mkdir()
    shutil.copy(big, peer_big)
    os.sync()
    big_id = service.register(f"file://{big}", run_name="big")
    # rclone answers UploadPartCopy with 200 and copies nothing (the service refuses such a
    # copy), and one CopyObject stops at 5 GiB: no faithful server-side copy beyond that
    s3_to_s3 = args.server == "moto" or args.big_gib * 1024 * MiB <= S3_MAX_SINGLE_COPY
    moved = move_case(
        s3, s3_url, service, big_id, peer_big, {"model.ckpt": big.stat().st_size}, s3_to_s3=s3_to_s3
    )
    out["one_object"] = {"checkpoint": f"1 x {args.big_gib} GiB", **moved}
    if not s3_to_s3:
        out["one_object"]["s3_to_s3"] = "not measured: rclone copies nothing on UploadPartCopy"
    print(json.dumps(out["one_object"], indent=2), flush=True)
    peer_big.unlink()
    return out


def class_change(
    work: Path, hot: Path, peer_src: Path, files: dict[str, int], s3_url: str
) -> dict[str, Any]:
    """2. A class change in place (two tiers on one bucket prefix), through a counting
    proxy: the bytes that pass through the worker, counted, not assumed. On moto, which
    keeps storage classes."""
    s3 = boto3.client("s3", endpoint_url=s3_url)
    proxy = CountingProxy(s3_url)
    inplace = Service(
        work / "inplace",
        [
            {"name": "hot", "url": f"file://{hot}"},
            s3_tier("ia", "inplace", proxy.url, "STANDARD_IA"),
            s3_tier("glacier", "inplace", proxy.url, "GLACIER_IR"),
        ],
    )
    s5 = [str(BIN / "s5cmd"), "--endpoint-url", s3_url]
    timed(
        [*s5, "cp", "--storage-class", "STANDARD_IA", f"{peer_src}/*", "s3://inplace/ckpt/b/"],
        dict(os.environ),
    )
    inplace_id = inplace.register("s3://inplace/ckpt/b")
    up, down = proxy.bytes_up, proxy.bytes_down
    moved = inplace.move(inplace_id, "glacier")
    classes = {
        s3.head_object(Bucket="inplace", Key=f"ckpt/b/{name}").get("StorageClass") for name in files
    }
    if classes != {"GLACIER_IR"}:
        raise SystemExit(f"the class change left {classes}")
    return {
        "seconds": moved.phases["total_s"],
        "worker_process_s": round(moved.process_s, 2),
        "body_bytes_to_s3": proxy.bytes_up - up,
        "body_bytes_from_s3": proxy.bytes_down - down,
        "classes_after": sorted(classes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--big-gib", type=int, default=2, help="one object this large; 0: none")
    parser.add_argument(
        "--server",
        choices=("rclone", "moto"),
        default="rclone",
        help="the S3 server the moves are timed on (see move_server)",
    )
    parser.add_argument("--delete-objects", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "transfer.json")
    args = parser.parse_args()
    os.environ.update(ENV)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.python_version()}",
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        work = Path(tmp)
        hot = work / "data" / "hot"
        source = hot / "bench" / "run" / "step-1"
        for i in range(args.shards):
            make_file(source / f"shard-{i:02d}.bin", args.shard_mib * MiB)
        files = {f"shard-{i:02d}.bin": args.shard_mib * MiB for i in range(args.shards)}
        peer_src = work / "peer-src"
        shutil.copytree(source, peer_src)  # the service's move deletes its source
        os.sync()  # no write-back of the files just written during the timed moves
        with move_server(args.server, work) as (s3_url, server_pid):
            results["moves"] = moves(args, work, hot, source, peer_src, files, s3_url)
            results["moves"]["server"] = args.server
            if server_pid is not None:
                results["moves"]["server_peak_rss_MiB"] = round(
                    memory_kib(server_pid)["VmHWM"] / 1024, 1
                )
        with moto_server() as s3_url:
            s3 = boto3.client("s3", endpoint_url=s3_url)
            s3.create_bucket(Bucket="inplace")
            results["class_change_in_place"] = class_change(work, hot, peer_src, files, s3_url)
        print(json.dumps(results["class_change_in_place"], indent=2), flush=True)

        # 3. delete N objects
        served = work / "rclone-root"
        for prefix in ("svc", "s5"):
            folder = served / "del" / prefix
            folder.mkdir(parents=True)
            for i in range(args.delete_objects):
                (folder / f"o{i:06d}").write_bytes(b"x")
        with rclone_s3(served, work / "rclone.log") as (rclone_url, _pid):
            storage = S3Storage("del", "", endpoint_url=rclone_url)
            settle_disk()  # as `timed` does before the peer
            started = time.perf_counter()
            deleted = storage.delete_prefix("svc")
            ours = time.perf_counter() - started
            s5_rclone = [str(BIN / "s5cmd"), "--endpoint-url", rclone_url]
            peer = timed([*s5_rclone, "rm", "s3://del/s5/*"], dict(os.environ))
        left = sum(1 for _ in (served / "del").rglob("o*"))
        if deleted != args.delete_objects or left:
            raise SystemExit(f"deletes incomplete: {deleted} deleted, {left} left on the server")
        results["delete"] = {
            "server": "rclone serve s3",
            "objects": args.delete_objects,
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
