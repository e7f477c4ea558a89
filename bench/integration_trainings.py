"""The trainings bench/integrations.py times, run with the frameworks' Python: one
framework per call, the same training without the integration (`bare`) and with it
(`catalog`), alternating round by round after an untimed warm-up, each saving a checkpoint
of about 100 MB (weights and Adam's two moments) on local disk at every step.

Per save it records the framework's own save (`save_s`: for an asynchronous save, from the
call to the upload's completion) and the time the integration's own code held the
training thread (`added_s`): the integration's entry points timed from outside, less the
framework's calls made inside them. A commit sent from a writer thread does not count
there, and is reported apart (`writer_s`) where there is one to time. One JSON line out.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PEERS = ("bare", "catalog")


class Clock:
    """Durations by name, and the time the framework's inner calls took on the training
    thread while an integration's entry point was running (to take off it)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.inner = threading.local()
        self.main = threading.main_thread()

    def outer(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """Time `call` as integration code: its duration less the inner time within it."""

        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not self.main:
                started = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.times["writer"].append(time.perf_counter() - started)
            if getattr(self.inner, "depth", 0):  # called back from within one: part of it
                return call(*args, **kwargs)
            self.inner.depth, self.inner.spent = 1, 0.0
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.inner.depth = 0
                self.times[name].append(time.perf_counter() - started - self.inner.spent)

        return timed

    def framework(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """Time `call` as the framework's own work (`save` when on the training thread)."""

        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            main = threading.current_thread() is self.main
            if main and getattr(self.inner, "framework", False):  # within one: counted there
                return call(*args, **kwargs)
            if main:
                self.inner.framework = True
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                if main:
                    self.inner.framework = False
                    self.inner.spent = getattr(self.inner, "spent", 0.0) + spent
                self.times[name].append(spent)

        return timed

    def take(self) -> dict[str, list[float]]:
        taken, self.times = dict(self.times), defaultdict(list)
        return taken


def rounds(options: argparse.Namespace) -> list[str]:
    """Warm-up, then the peers alternating, so a noisy neighbour or the disk's write-back
    hits both alike."""
    return ["warm-up"] + [p for r in range(options.rounds) for p in PEERS[:: 1 - 2 * (r % 2)]]


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def lightning(options: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from lightning.fabric.plugins import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from torch.utils.data import DataLoader, TensorDataset

    from ckpt_client.lightning import CatalogCallback, CatalogCheckpointIO

    class Wide(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(
                *[torch.nn.Linear(options.width, options.width) for _ in range(options.layers)]
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self.layers(batch[0]).pow(2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    class TimedIO(TorchCheckpointIO):
        save_checkpoint = clock.framework("save", TorchCheckpointIO.save_checkpoint)

    CatalogCheckpointIO.save_checkpoint = clock.outer(  # type: ignore[method-assign]
        "added", CatalogCheckpointIO.save_checkpoint
    )
    CatalogCallback.on_save_checkpoint = clock.outer(  # type: ignore[method-assign]
        "added", CatalogCallback.on_save_checkpoint
    )
    for hook in ("setup", "on_fit_start", "on_fit_end"):  # once a fit: the run's start and end
        setattr(CatalogCallback, hook, clock.outer("run", getattr(CatalogCallback, hook)))
    data = TensorDataset(torch.randn(8 * options.saves, options.width))
    out: dict[str, Any] = {}
    for mode in ("plain", "async"):
        result: dict[str, Any] = {"bare": [], "catalog": []}
        for number, peer in enumerate(rounds(options)):
            torch.manual_seed(0)
            name = f"lightning-{mode}-{peer}-{options.stamp}-{number}"
            dirpath = options.output_root / name
            io = TimedIO() if mode == "plain" else AsyncCheckpointIO(TimedIO())
            callbacks: list[Any] = [
                ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)
            ]
            if peer == "catalog":
                callbacks.append(CatalogCallback(project="bench", run_name=name))
            trainer = pl.Trainer(
                max_steps=options.saves,
                accelerator="cpu",
                devices=1,
                callbacks=callbacks,
                plugins=[io],
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=True,
            )
            clock.take()
            started = time.perf_counter()
            trainer.fit(Wide(), DataLoader(data, batch_size=8))
            wall = time.perf_counter() - started
            times = clock.take()
            written = sorted(dirpath.glob("*.ckpt"))
            assert len(written) == options.saves, (name, len(written))
            result["checkpoint_bytes"] = written[0].stat().st_size
            shutil.rmtree(dirpath)
            if peer != "warm-up":
                result[peer].append({"wall_s": wall, **{f"{k}_s": v for k, v in times.items()}})
        out[mode] = result
    return out


def dcp(options: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import os
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as torch_dcp

    import ckpt_client
    import ckpt_client.dcp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="bench-dcp-"), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    raw_async_save = torch_dcp.async_save
    timed_async_save = clock.framework("stage", raw_async_save)
    torch_dcp.async_save = timed_async_save  # the module the integration calls into
    catalog_save = clock.outer("added", ckpt_client.dcp.async_save)
    client = ckpt_client.Client()
    shape = (options.width, options.width)
    result: dict[str, Any] = {"bare": [], "catalog": []}
    for number, peer in enumerate(rounds(options)):
        torch.manual_seed(0)
        name = f"dcp-{peer}-{options.stamp}-{number}"
        run = client.run("bench", name) if peer == "catalog" else None
        model = torch.nn.Sequential(*[torch.nn.Linear(*shape) for _ in range(options.layers)])
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        root = options.output_root / name
        clock.take()
        saves: list[float] = []
        futures: list[Any] = []
        started = time.perf_counter()
        for step in range(1, options.saves + 1):
            optimizer.zero_grad()
            model(torch.randn(8, options.width)).pow(2).mean().backward()
            optimizer.step()
            state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
            began = time.perf_counter()
            target = str(root / f"step-{step}")
            if peer == "catalog":
                future = catalog_save(state, run=run, step=step, checkpoint_id=target)
                future.upload_completion.result()  # what a job waits for (the commit: not)
            else:
                future = timed_async_save(state, checkpoint_id=target)
                future.result()
            saves.append(time.perf_counter() - began)
            futures.append(future)
        wall = time.perf_counter() - started
        if peer == "catalog":
            committed = [f.result(timeout=60) for f in futures]
            assert all(c is not None and c.state == "active" for c in committed), committed
        times = clock.take()
        result["checkpoint_bytes"] = size_of(root / "step-1")
        shutil.rmtree(root)
        if peer != "warm-up":
            entry = {"wall_s": wall, "save_s": saves, **{f"{k}_s": v for k, v in times.items()}}
            result[peer].append(entry)
    client.close()
    dist.destroy_process_group()
    return result


def transformers(options: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from ckpt_client.transformers import CatalogCallback

    class TimedTrainer(Trainer):
        _save_checkpoint = clock.framework("save", Trainer._save_checkpoint)

    CatalogCallback.on_save = clock.outer("added", CatalogCallback.on_save)  # type: ignore[method-assign]
    for hook in ("on_train_begin", "on_train_end"):  # once a training: the run's start and end
        setattr(CatalogCallback, hook, clock.outer("run", getattr(CatalogCallback, hook)))

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, vocab: int) -> None:
            generator = torch.Generator().manual_seed(1)
            self.ids = torch.randint(0, vocab, (64, 32), generator=generator)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    # A GPT-2 of width 256 and 8 layers over a vocabulary of 8,192: about 100 MB a save.
    config = GPT2Config(
        vocab_size=8192, n_positions=32, n_embd=256, n_layer=8, n_head=4, bos_token_id=0
    )
    result: dict[str, Any] = {"bare": [], "catalog": []}
    for number, peer in enumerate(rounds(options)):
        torch.manual_seed(0)
        name = f"hf-{peer}-{options.stamp}-{number}"
        args = TrainingArguments(
            output_dir=str(options.output_root / name),
            max_steps=options.saves,
            save_steps=1,
            save_total_limit=None,
            per_device_train_batch_size=2,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        callback = CatalogCallback("bench", name) if peer == "catalog" else None
        trainer = TimedTrainer(
            model=GPT2LMHeadModel(config),
            args=args,
            train_dataset=Tokens(config.vocab_size),
            callbacks=[callback] if callback else [],
        )
        clock.take()
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        times = clock.take()
        output = Path(args.output_dir)
        assert len(list(output.glob("checkpoint-*"))) == options.saves
        result["checkpoint_bytes"] = size_of(output / "checkpoint-1")
        shutil.rmtree(output)
        if peer != "warm-up":
            result[peer].append({"wall_s": wall, **{f"{k}_s": v for k, v in times.items()}})
    return result


def orbax(options: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import ckpt_client
    from ckpt_client.orbax import CatalogCheckpointManager

    for method in ("save", "wait_until_finished"):
        setattr(
            ocp.CheckpointManager,
            method,
            clock.framework(method, getattr(ocp.CheckpointManager, method)),
        )
        setattr(
            CatalogCheckpointManager,
            method,
            clock.outer("added", vars(CatalogCheckpointManager)[method]),
        )
    client = ckpt_client.Client()
    # four float32 arrays of about 2,500 x 2,500: 100 MB a save
    side = int((options.width**2 * options.layers * 3) ** 0.5 / 2)
    result: dict[str, Any] = {"bare": [], "catalog": []}
    for number, peer in enumerate(rounds(options)):
        name = f"orbax-{peer}-{options.stamp}-{number}"
        root = options.output_root / name
        keys = jax.random.split(jax.random.PRNGKey(0), 4)  # random: orbax compresses
        state = {
            f"w{i}": jax.random.normal(k, (side, side), dtype=jnp.float32)
            for i, k in enumerate(keys)
        }
        manager_options = ocp.CheckpointManagerOptions(max_to_keep=None)
        if peer == "catalog":
            manager: Any = CatalogCheckpointManager(
                root, manager_options, run=client.run("bench", name)
            )
        else:
            manager = ocp.CheckpointManager(root, options=manager_options)
        clock.take()
        saves: list[float] = []
        started = time.perf_counter()
        with manager:
            for step in range(1, options.saves + 1):
                state = jax.tree.map(lambda x: x * 0.999 + 0.001, state)
                jax.block_until_ready(state)
                began = time.perf_counter()
                manager.save(step, args=ocp.args.StandardSave(state))
                manager.wait_until_finished()
                saves.append(time.perf_counter() - began)
            if peer == "catalog":
                manager.wait_for_catalog()
                run = manager.run
        wall = time.perf_counter() - started
        times = clock.take()
        if peer == "catalog":
            states = [c.state for c in run.checkpoints()]
            assert states == ["active"] * options.saves, states
        result["checkpoint_bytes"] = size_of(root / "1")
        shutil.rmtree(root)
        if peer != "warm-up":
            entry = {
                "wall_s": wall,
                "save_s": saves,
                **{f"{k}_s": v for k, v in times.items() if k != "save"},
            }
            result[peer].append(entry)
    client.close()
    return result


TRAININGS: dict[str, Callable[[argparse.Namespace, Clock], dict[str, Any]]] = {
    "lightning": lightning,
    "dcp": dcp,
    "transformers": transformers,
    "orbax": orbax,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=sorted(TRAININGS))
    parser.add_argument("--output-root", type=Path, required=True)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=1448)  # 4 x 1448^2 x 3 x 4 B: 100 MB
    parser.add_argument("--layers", type=int, default=4)
    options = parser.parse_args()
    options.stamp = datetime.now(UTC).strftime("%Y%m%dt%H%M%S")
    result = TRAININGS[options.framework](options, Clock())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
