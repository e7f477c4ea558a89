"""Helpers of the import benchmark (bench/imports.py): the synthetic tree, the listing
peers (`find`, an `os.scandir` walk, `s5cmd ls`), `rclone serve s3` and the memory and CPU
figures read from /proc."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
ACCESS_KEY = "ckpt-bench-access-key"
SECRET_KEY = "ckpt-bench-secret-key"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_DEFAULT_REGION": "us-east-1",
}
CHECKPOINTS_PER_RUN = 400
# (layout, share in twentieths of the runs): mostly directory layouts, a few Lightning files
MIX = (
    ("hf", 6),
    ("megatron", 4),
    ("deepspeed", 3),
    ("orbax", 3),
    ("generic-dash", 1),
    ("generic-underscore", 1),
    ("dcp", 1),
    ("lightning", 1),
)
_LAYOUT_OF = [name for name, share in MIX for _ in range(share)]
_PAD = b"\0" * 4096


@dataclass
class Tree:
    """What was written: checkpoints, objects (unrecognized ones included), runs, layouts."""

    root: Path
    checkpoints: int = 0
    objects: int = 0
    runs: int = 0
    bytes: int = 0
    seconds: float = 0.0
    synced_s: float = 0.0  # how long its write-back took after `seconds` (os.sync)
    layouts: dict[str, int] | None = None


def _files(layout: str, step: int) -> tuple[str, list[str]]:
    """A checkpoint's directory (or file) name and its objects, relative to it."""
    if layout == "hf":
        shards = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
        rest = ["model.safetensors.index.json", "optimizer.pt", "scheduler.pt"]
        return f"checkpoint-{step}", [*shards, *rest, "rng_state.pth", "training_args.bin"]
    if layout == "megatron":
        ranks = [f"mp_rank_{r:02d}/model_optim_rng.pt" for r in range(8)]
        return f"iter_{step:07d}", [*ranks, "common.pt", "metadata.json"]
    if layout == "deepspeed":
        optim = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(8)]
        return f"global_step{step}", ["mp_rank_00_model_states.pt", *optim, "zero_to_fp32.py"]
    if layout == "orbax":
        data = [f"default/ocdbt.process_0/d/{r:032x}" for r in range(7)]
        return str(step), ["_CHECKPOINT_METADATA", "default/_METADATA", "default/manifest", *data]
    if layout == "dcp":
        return f"step-{step}", [".metadata", *(f"__{r}_0.distcp" for r in range(9))]
    shards = [f"shard-{r:02d}.bin" for r in range(9)]
    name = f"step-{step}" if layout == "generic-dash" else f"step_{step}"
    return name, [*shards, "meta.json"]


def _write(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if size:
            os.write(fd, _PAD[:size])
    finally:
        os.close(fd)


def _trainer_state(step: int) -> bytes:
    history = [{"step": step, "loss": round(1000 / step, 4), "eval_loss": round(2000 / step, 4)}]
    return json.dumps({"global_step": step, "log_history": history}).encode()


def build_tree(root: Path, count: int) -> Tree:
    """`count` checkpoints over count / 400 runs (at least 2), in teams of 10 runs:
    `<team>/<run>/checkpoints/<checkpoint>/...`, about 10 small files each (0-4095 bytes,
    varying), and one file per run that belongs to no checkpoint."""
    started = time.perf_counter()
    runs = max(2, round(count / CHECKPOINTS_PER_RUN))
    tree = Tree(root=root, runs=runs, layouts={})
    assert tree.layouts is not None
    for r in range(runs):
        layout = _LAYOUT_OF[r % len(_LAYOUT_OF)]
        mine = count // runs + (1 if r < count % runs else 0)
        run_dir = root / f"team-{r // 10:02d}" / f"run-{r:04d}-{layout}"
        base = run_dir / "checkpoints"
        base.mkdir(parents=True, exist_ok=True)
        _write(str(run_dir / "config.yaml"), 100 + r % 300)
        tree.objects += 1
        for k in range(mine):
            step = (k + 1) * 500
            name, files = _files(layout, step)
            seed = r * 7919 + k * 104729
            if layout == "lightning":
                _write(str(base / f"epoch={k // 10}-step={step}.ckpt"), seed % 4096)
                tree.objects += 1
                tree.bytes += seed % 4096
            else:
                ckpt = base / name
                made: set[str] = set()
                for i, file in enumerate(files):
                    parent = os.path.dirname(file)
                    if parent and parent not in made:
                        os.makedirs(ckpt / parent, exist_ok=True)
                        made.add(parent)
                    elif not made:
                        ckpt.mkdir(exist_ok=True)
                        made.add("")
                    size = (seed + i * 1299709) % 4096
                    _write(str(ckpt / file), size)
                    tree.bytes += size
                if layout == "hf":
                    (ckpt / "trainer_state.json").write_bytes(_trainer_state(step))
                    files.append("trainer_state.json")
                tree.objects += len(files)
            tree.checkpoints += 1
            tree.layouts[layout] = tree.layouts.get(layout, 0) + 1
    tree.seconds = time.perf_counter() - started
    return tree


# --------------------------------------------------------------------------- listing peers


def time_find(root: Path) -> tuple[float, int]:
    """`find -type f -printf '%s %T@ %p\\n' | wc -l`: seconds, lines."""
    started = time.perf_counter()
    out = subprocess.run(
        f"find '{root}' -type f -printf '%s %T@ %p\\n' | wc -l",
        shell=True,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - started, int(out.stdout.strip())


def _scan(directory: str) -> Iterator[os.stat_result]:
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield from _scan(entry.path)
            else:
                yield entry.stat()


def time_scandir(root: Path) -> tuple[float, int]:
    """A recursive `os.scandir` walk with `stat()` of each file: seconds, files."""
    started = time.perf_counter()
    files = sum(1 for _ in _scan(str(root)))
    return time.perf_counter() - started, files


def time_s5cmd(endpoint: str, url: str) -> tuple[float, int]:
    """`s5cmd --endpoint-url ... ls 'url'`: seconds, lines."""
    started = time.perf_counter()
    out = subprocess.run(
        f"'{BIN / 's5cmd'}' --endpoint-url {endpoint} ls '{url}' | wc -l",
        shell=True,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **S3_ENV},
    )
    return time.perf_counter() - started, int(out.stdout.strip())


# --------------------------------------------------------------------------- rclone


def settle_disk() -> None:
    """Write back what earlier steps left in the page cache before the next is timed. A
    step that writes gigabytes (a tree of a million files, a 2 GiB move) would otherwise
    have its write-back fall inside whichever step comes next, the service's or a peer's,
    and that step's time would depend on what ran before it."""
    os.sync()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def rclone_s3(root: Path, log: Path, *, etag: bool = True) -> Iterator[tuple[str, int]]:
    """`rclone serve s3` over `root` (a bucket per top-level directory): (url, pid).

    Without `etag`, a HEAD answers no ETag: the server does not read the whole file to
    compute its MD5 at every HEAD (S3 stores it at upload), which would make a check by
    HEAD cost a read of every byte. Uploaded parts still get their MD5 ETags."""
    port = free_port()
    command = [
        str(BIN / "rclone"),
        "serve",
        "s3",
        "--config",
        os.devnull,
        "--auth-key",
        f"{ACCESS_KEY},{SECRET_KEY}",
        "--addr",
        f"127.0.0.1:{port}",
        *(() if etag else ("--etag-hash", "")),
        str(root),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError(f"rclone exited: {log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --------------------------------------------------------------------------- /proc


def memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak resident set) and VmRSS of `pid`, in KiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def process_cpu(pid: int) -> float:
    """User and system CPU seconds of `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
