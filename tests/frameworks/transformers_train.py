"""A training script for tests/frameworks/test_transformers.py, run with the frameworks'
Python: a two-layer, width-32 GPT-2 built from its config (no download) trained on random
tokens by the Hugging Face Trainer, with `ckpt_client.transformers.CatalogCallback`.

    transformers_train.py OUTPUT_DIR PROJECT RUN --max-steps 12 --save-steps 2
        [--milestone-every N] [--metric NAME] [--scores JSON] [--save-strategy best]
        [--save-total-limit N] [--resume] [--deadline S] [--hold save:8|step:7 --hold-dir D]

`--scores` scripts the evaluation's `score` metric by step ({"2": 0.5, ...}), so a test
knows which save is the best. `--hold save:N` stops the save of step N after the weights,
optimizer and scheduler are written and before the RNG state and `trainer_state.json`
(so before `on_save`); `--hold step:N` stops at the end of step N, between saves. Either
writes `held` in the hold directory and waits for `go` there, which a test that SIGKILLs
the process never writes. Prints `resumed from PATH at step N` when it resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from ckpt_client import Client, resume_path
from ckpt_client.transformers import CatalogCallback

VOCAB = 64
SEQUENCE = 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (count, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Hold:
    """Where the training stops for the test: `held` written, then a wait for `go`."""

    def __init__(self, spec: str | None, directory: Path | None) -> None:
        self.kind, self.step = (spec.split(":")[0], int(spec.split(":")[1])) if spec else ("", -1)
        self.directory = directory

    def at(self, kind: str, step: int) -> None:
        if kind != self.kind or step != self.step or self.directory is None:
            return
        (self.directory / "held").write_text(str(step))
        while not (self.directory / "go").exists():
            time.sleep(0.05)


class HeldTrainer(Trainer):
    hold: Hold

    def _save_rng_state(self, output_dir: str) -> None:
        self.hold.at("save", self.state.global_step)
        super()._save_rng_state(output_dir)


class HoldAtStep(TrainerCallback):
    def __init__(self, hold: Hold) -> None:
        self.hold = hold

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hold.at("step", state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("project")
    parser.add_argument("run")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--save-strategy", default="steps")
    parser.add_argument("--save-total-limit", type=int)
    parser.add_argument("--milestone-every", type=int)
    parser.add_argument("--metric")
    parser.add_argument("--scores", type=json.loads, default={})
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--deadline", type=float)
    parser.add_argument("--hold")
    parser.add_argument("--hold-dir", type=Path)
    options = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQUENCE,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    args = TrainingArguments(
        output_dir=str(options.output_dir),
        max_steps=options.max_steps,
        per_device_train_batch_size=4,
        save_strategy=options.save_strategy,
        save_steps=options.save_steps,
        save_total_limit=options.save_total_limit,
        eval_strategy="steps",
        eval_steps=options.save_steps,
        metric_for_best_model="score" if options.save_strategy == "best" else None,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    client = Client(deadline=options.deadline) if options.deadline else None
    catalog = CatalogCallback(
        options.project,
        options.run,
        client=client,
        milestone_every_n_steps=options.milestone_every,
        metric_for_best_model=options.metric,
    )
    hold = Hold(options.hold, options.hold_dir)
    trainer: HeldTrainer

    def score(_: Any) -> dict[str, float]:  # the scripted score of the step evaluated
        return {"score": float(options.scores.get(str(trainer.state.global_step), 0))}

    trainer = HeldTrainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(256, seed=1),
        eval_dataset=Tokens(8, seed=2),
        callbacks=[catalog, HoldAtStep(hold)],
        compute_metrics=score,
    )
    trainer.hold = hold
    start = resume_path(options.project, options.run) if options.resume else None
    if start is not None:
        state = json.loads((Path(start) / "trainer_state.json").read_text())
        print(f"resumed from {start} at step {state['global_step']}", flush=True)
    trainer.train(resume_from_checkpoint=None if start is None else str(start))
    print(f"trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
