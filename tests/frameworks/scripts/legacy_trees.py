"""Trees of checkpoints as the training frameworks leave them with no catalog at all (their
own APIs only, no ckpt_client), for tests/frameworks/test_import_trees.py: tiny models on
the CPU, one framework per invocation.

    legacy_trees.py lightning DIR --max-steps N --every K
    legacy_trees.py hf DIR --max-steps N --every K
    legacy_trees.py dcp DIR --save-at 2,4,6
    legacy_trees.py orbax DIR --max-steps N --every K

lightning: a `Trainer` whose `ModelCheckpoint(dirpath=DIR, every_n_train_steps=K,
save_top_k=-1, save_last=True)` writes `epoch=E-step=S.ckpt` and `last.ckpt`. hf: the
Hugging Face `Trainer` (a two-layer GPT-2 of width 32 from its config, random tokens)
saving and evaluating every K steps into DIR/checkpoint-<N>/. dcp: `dcp.save` of a model
and its optimizer to DIR/step-<N>/ at each step of `--save-at`. orbax: a
`CheckpointManager` on DIR saving a pytree every K steps (DIR/<N>/).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def lightning(directory: Path, max_steps: int, every: int) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

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

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        callbacks=[
            ModelCheckpoint(
                dirpath=directory, every_n_train_steps=every, save_top_k=-1, save_last=True
            )
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))


def hf(directory: Path, max_steps: int, every: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    vocab, sequence = 64, 16

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, count: int, seed: int) -> None:
            generator = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(0, vocab, (count, sequence), generator=generator)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=sequence,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    args = TrainingArguments(
        output_dir=str(directory),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=every,
        eval_strategy="steps",
        eval_steps=every,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(256, seed=1),
        eval_dataset=Tokens(8, seed=2),
    )
    trainer.train()


def dcp(directory: Path, save_at: list[int]) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(1, max(save_at) + 1):
        inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in save_at:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optimizer_state, "step": step}
            dcp.save(state, checkpoint_id=str(directory / f"step-{step}"))


def orbax(directory: Path, max_steps: int, every: int) -> None:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    state: dict[str, Any] = {
        "w": jnp.ones((4, 4), dtype=jnp.float32),
        "b": jnp.zeros((4,), dtype=jnp.float32),
    }
    options = ocp.CheckpointManagerOptions(save_interval_steps=every)
    with ocp.CheckpointManager(directory, options=options) as manager:
        for step in range(1, max_steps + 1):
            state = jax.tree.map(lambda x, s=step: x * 0.99 + 0.01 * s, state)
            if step % every == 0:
                manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["lightning", "hf", "dcp", "orbax"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--save-at", default="")
    args = parser.parse_args()
    if args.framework == "lightning":
        lightning(args.directory, args.max_steps, args.every)
    elif args.framework == "hf":
        hf(args.directory, args.max_steps, args.every)
    elif args.framework == "dcp":
        dcp(args.directory, sorted(int(s) for s in args.save_at.split(",") if s))
    else:
        orbax(args.directory, args.max_steps, args.every)
    print(f"DONE {args.framework}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
