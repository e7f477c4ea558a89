"""A tiny Lightning training on the CPU, catalogued by `ckpt_client.lightning`.

    lightning_train.py PROJECT RUN_NAME DIRPATH MAX_STEPS EVERY [options]

Prints `SAVING <step>` as a (slow) save starts and `AT <step>` when `--hold-at` is reached,
then waits on a gate file: that is where the tests SIGKILL it (or open the gate).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

import ckpt_client
from ckpt_client.lightning import CatalogCallback

GATE = "gate"  # in the working directory: a test that opens it lets the training go on


def hold(what: str) -> None:
    print(what, flush=True)
    while not Path(GATE).exists():
        time.sleep(0.05)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SlowIO(TorchCheckpointIO):
    """A disk that stalls mid-write at one step: half the file is there, then nothing."""

    def __init__(self, stall_at: int) -> None:
        super().__init__()
        self.stall_at = stall_at

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if int(checkpoint["global_step"]) == self.stall_at:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(b"half a checkpoint")
            hold(f"SAVING {checkpoint['global_step']}")
        super().save_checkpoint(checkpoint, path, storage_options)


class HoldAt(pl.Callback):
    """At `step`: hold there (to be killed), or raise (a training that crashes)."""

    def __init__(self, step: int, crash: bool) -> None:
        self.step = step
        self.crash = crash

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:
            return
        if self.crash:
            raise RuntimeError(f"crashed at step {self.step}")
        hold(f"AT {trainer.global_step}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project")
    parser.add_argument("run_name")
    parser.add_argument("dirpath")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("every", type=int)
    parser.add_argument("--milestone-every", type=int)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--stall-at", type=int)
    parser.add_argument("--hold-at", type=int)
    parser.add_argument("--fail-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--deadline", type=float, help="the client's per-call deadline (s)")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    plugins: list[Any] = []
    if args.asynchronous:
        inner = SlowIO(args.stall_at) if args.stall_at is not None else None
        plugins.append(AsyncCheckpointIO(inner))
    callbacks: list[pl.Callback] = [
        ModelCheckpoint(
            dirpath=args.dirpath, every_n_train_steps=args.every, save_top_k=args.top_k
        ),
        CatalogCallback(
            project=args.project,
            run_name=args.run_name,
            milestone_every_n_steps=args.milestone_every,
            client=ckpt_client.Client(deadline=args.deadline) if args.deadline else None,
        ),
    ]
    if args.hold_at is not None:
        callbacks.append(HoldAt(args.hold_at, crash=False))
    if args.fail_at is not None:
        callbacks.append(HoldAt(args.fail_at, crash=True))
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        plugins=plugins,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    ckpt_path = ckpt_client.resume_path(args.project, args.run_name) if args.resume else None
    print(f"RESUME {ckpt_path}", flush=True)
    start = torch.load(ckpt_path, weights_only=False)["global_step"] if ckpt_path else 0
    print(f"START {start}", flush=True)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
    print(f"DONE {trainer.global_step}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
