"""A tiny training job that checkpoints with torch.distributed.checkpoint through
`ckpt_client.dcp`, on the CPU with gloo: an nn.Linear and its Adam optimizer, one
optimization step per step, a save at each step of `--save-at`.

    dcp_train.py --project P --run R --root DIR --save-at 2,4 --mode thread|process|sync
                 [--resume] [--fail-at STEP] [--hang-at STEP] [--world N] [--async-staging]
                 [--no-collectives] [--hold-at STEP] [--deadline S] --report OUT.json

Each save goes to DIR/step-<step>. `--resume` loads the run's newest checkpoint first
(`ckpt_client.resume_path`, then `dcp.load`) and goes on from its step. `--fail-at` makes
the storage writer of that step's save fail once the plan is made; `--hang-at` makes it
write a partial file and hang (`DIR/step-<step>.hanging` says when, with the pid of the
process that writes), to be killed. `--world 2` runs two ranks (processes of their own, a
FileStore between them); only rank 0 has a run.
`--async-staging` stages in the background (a DefaultStager of its own), so that DCP's
async_save answers an AsyncSaveResponse instead of a Future. `--no-collectives` saves
with `use_collectives=False` (each rank its own metadata file). `--hold-at` waits, once
every save before that step is committed (or spooled), for a file `gate` in the working
directory, printing `AT <step>`; `--deadline` is the client's per-call deadline.

The report (JSON, rank 0's, with every rank's errors) says what each save was committed
as, the files its write results named with their extents, and what a resume loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import ckpt_client
import ckpt_client.dcp

GATE = "gate"  # in the working directory: a test that opens it lets a held training go on
MODES = {
    "thread": ckpt_client.dcp.AsyncCheckpointerType.THREAD,
    "process": ckpt_client.dcp.AsyncCheckpointerType.PROCESS,
}


class Training(Stateful):
    """The model, its optimizer and the step, as one Stateful (DCP calls `state_dict` at
    save and `load_state_dict` at load)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(8, 4)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.step = 0

    def train_step(self) -> float:
        self.step += 1
        inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(self.step))
        loss = self.model(inputs).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss)

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optimizer, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
        self.step = int(state["step"])

    def weights(self) -> list[float]:
        return [float(x) for x in self.model.weight.detach().flatten()]


class FailingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter whose write fails: a full disk, as the save sees one."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        raise OSError(28, "No space left on device (injected)")


class HangingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter that writes one file, says so in `<dir>.hanging` (with the pid of
    the process writing: DCP's checkpoint process in process mode), and then hangs: a save
    in the middle of its writes when the job is preempted (SIGKILL)."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        directory = Path(self.path)
        (directory / "__0_0.distcp").write_bytes(b"partial")
        directory.with_name(directory.name + ".hanging").write_text(str(os.getpid()))
        time.sleep(3600)
        raise AssertionError("never woken")


def extents(metadata: Any) -> dict[str, int]:
    """Each file the write results name, with the end of the last item written to it."""
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    return ends


def on_disk(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


def checkpoint_json(checkpoint: ckpt_client.Checkpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    return {
        "id": checkpoint.id,
        "step": checkpoint.step,
        "state": checkpoint.state,
        "class": checkpoint.cls,
        "uri": checkpoint.uri,
        "size_bytes": checkpoint.size_bytes,
        "metrics": dict(checkpoint.metrics),
        "files": None
        if checkpoint.files is None
        else {f["path"]: f["size_bytes"] for f in checkpoint.files},
    }


def train(rank: int, args: argparse.Namespace, store_path: str) -> None:
    report: dict[str, Any] = {"rank": rank, "saves": [], "errors": []}
    try:
        _train(rank, args, store_path, report)
    except BaseException as error:
        report["errors"].append({"where": "train", "error": f"{type(error).__name__}: {error}"})
        traceback.print_exc()
        raise
    finally:
        out = Path(args.report if rank == 0 else f"{args.report}.rank{rank}")
        out.write_text(json.dumps(report, indent=1))
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(rank: int, args: argparse.Namespace, store_path: str, report: dict[str, Any]) -> None:
    store = dist.FileStore(store_path, args.world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.world)
    training = Training()
    deadline = {"deadline": args.deadline} if args.deadline else {}
    client = ckpt_client.Client(**deadline) if rank == 0 else None  # the others never call it
    run = client.run(args.project, args.run) if client is not None else None
    root = Path(args.root)

    if args.resume:
        path = ckpt_client.resume_path(args.project, args.run, client=client)
        report["resumed_from"] = None if path is None else str(path)
        if path is not None:
            dcp.load({"training": training}, checkpoint_id=path)
            report["loaded_step"] = training.step
            report["loaded_weights"] = training.weights()

    saves = sorted(int(s) for s in args.save_at.split(",") if s)
    pending: ckpt_client.dcp.SaveFuture | None = None
    pending_step = 0
    stager = None
    if args.async_staging:  # async_save answers an AsyncSaveResponse then
        stager = DefaultStager(StagingOptions(False, False, True, False))

    def finish(future: ckpt_client.dcp.SaveFuture, step: int) -> None:
        entry: dict[str, Any] = {"step": step}
        try:
            entry["checkpoint"] = checkpoint_json(future.result(timeout=300))
        except BaseException as error:
            entry["error"] = f"{type(error).__name__}: {error}"
            entry["checkpoint"] = checkpoint_json(future.checkpoint)
        if future.metadata is not None:
            entry["extents"] = extents(future.metadata)
        entry["on_disk"] = (
            on_disk(root / f"step-{step}") if (root / f"step-{step}").is_dir() else {}
        )
        report["saves"].append(entry)

    while training.step < max(saves, default=0):
        loss = training.train_step()
        if training.step == args.hold_at:  # every save so far committed, then wait
            if pending is not None:
                finish(pending, pending_step)
                pending = None
            print(f"AT {training.step}", flush=True)
            while not Path(GATE).exists():
                time.sleep(0.05)
        if training.step not in saves:
            continue
        step = training.step
        report.setdefault("weights", {})[str(step)] = training.weights()
        target = root / f"step-{step}"
        extra: dict[str, Any] = {}
        if step == args.fail_at:
            extra["storage_writer"] = FailingWriter(target)
        if step == args.hang_at:
            extra["storage_writer"] = HangingWriter(target)
        if stager is not None:
            extra["async_stager"] = stager
        if args.no_collectives:
            extra["use_collectives"] = False
        if args.mode == "sync":
            entry: dict[str, Any] = {"step": step}
            try:
                committed = ckpt_client.dcp.save(
                    {"training": training},
                    run=run,
                    step=step,
                    checkpoint_id=target,
                    metrics={"loss": loss},
                    **extra,
                )
                entry["checkpoint"] = checkpoint_json(committed)
                # the write results, as the save recorded them in its metadata file
                entry["extents"] = extents(dcp.FileSystemReader(target).read_metadata())
            except BaseException as error:
                entry["error"] = f"{type(error).__name__}: {error}"
            entry["on_disk"] = on_disk(target) if target.is_dir() else {}
            report["saves"].append(entry)
            continue
        if pending is not None:
            finish(pending, pending_step)  # one save in flight at a time, as jobs do
        try:
            pending = ckpt_client.dcp.async_save(
                {"training": training},
                run=run,
                step=step,
                checkpoint_id=str(target),  # a plain string path, as DCP takes it too
                metrics={"loss": loss},
                async_checkpointer_type=MODES[args.mode],
                **extra,
            )
            pending_step = step
        except BaseException as error:
            report["errors"].append(
                {"where": f"save {step}", "error": f"{type(error).__name__}: {error}"}
            )
            raise
        pending.staging_completion.result(timeout=300)
    if pending is not None:
        finish(pending, pending_step)
    if stager is not None:
        stager.close()
    if client is not None:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--save-at", default="2,4")
    parser.add_argument("--mode", choices=["thread", "process", "sync"], default="thread")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--async-staging", action="store_true")
    parser.add_argument("--no-collectives", action="store_true")
    parser.add_argument("--report", required=True)
    parser.add_argument("--hold-at", type=int, default=-1, help="print AT <step>, wait for ./gate")
    parser.add_argument("--deadline", type=float, help="the client's per-call deadline (s)")
    args = parser.parse_args()
    # the process checkpointer's own process group meets on MASTER_ADDR (else this host's
    # name, which a sandbox may not resolve)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # the ranks' rendezvous file, removed with its directory once every rank is done
    with tempfile.TemporaryDirectory(prefix="dcp-store-") as store_dir:
        return _run(args, os.path.join(store_dir, "store"))


def _run(args: argparse.Namespace, store_path: str) -> int:
    if args.world == 1:
        train(0, args, store_path)
        return 0
    context = mp.spawn(train, args=(args, store_path), nprocs=args.world, join=False)
    try:
        while not context.join():
            pass
    except mp.ProcessRaisedException as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
