"""A Hugging Face Trainer job whose checkpoints the service keeps: the worked example of
`ckpt_client.transformers.CatalogCallback` (docs/integrations.md).

A GPT-2 of two layers and width 32, built from its config (nothing is downloaded), learns
random tokens on the CPU and saves every `--save-every` steps into
`<hot tier>/<project>/<run>`, where the service reads it. Run it again with more `--steps`
and it resumes from the run's newest checkpoint, staged back onto the hot tier if a policy
had moved it away.

    make run                                             # in one terminal
    pip install './client[transformers]'                 # or the frameworks' test Python:
    PYTHONPATH=client/src "$(bash tests/frameworks/env.sh)" examples/transformers_job.py
    ... examples/transformers_job.py --steps 60          # again: resumes at step 40

It ends with the run's checkpoints as the catalog has them. The policy (`default` under
`make run`: the last 3 rolling ones) deletes the others once they are a minute old (the
service protects newer ones), at the next sweep or registration: run it again a minute
later and they are gone.
`--url` and `--token` default to CKPT_URL and CKPT_TOKEN. The service's tiers must be local
(`file://`) and on this machine: the Trainer writes to a local directory.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ckpt_client import Client, resume_path
from ckpt_client.transformers import CatalogCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="examples")
    parser.add_argument("--run", default="gpt2-tiny")
    parser.add_argument("--steps", type=int, default=40, help="train up to this step")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--milestone-every", type=int, default=20)
    parser.add_argument("--url", default=os.environ.get("CKPT_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("CKPT_TOKEN"))
    options = parser.parse_args()

    client = Client(options.url, token=options.token)
    hot = client.tiers()[0]
    if hot.local_path is None:
        parser.error(f"the hottest tier, {hot.name}, is not local ({hot.url})")
    output_dir = hot.local_path / options.project / options.run

    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=options.steps,
        save_steps=options.save_every,
        save_total_limit=None,  # the service's policy deletes, never the Trainer
        eval_strategy="steps",
        eval_steps=options.save_every,
        per_device_train_batch_size=8,
        logging_steps=options.save_every,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=64,
            n_positions=16,
            n_embd=32,
            n_layer=2,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    catalog = CatalogCallback(
        options.project,
        options.run,
        client=client,
        labels={"example": "transformers"},
        milestone_every_n_steps=options.milestone_every,
        metric_for_best_model="eval_loss",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(512, seed=1),
        eval_dataset=Tokens(32, seed=2),
        callbacks=[catalog],
    )
    start = resume_path(options.project, options.run, client=client)
    print(f"resuming from {start}" if start else f"a new run, saving under {output_dir}")
    trainer.train(resume_from_checkpoint=None if start is None else str(start))

    run = client.find_run(options.project, options.run)
    assert run is not None
    print(f"\nrun {run.project}/{run.name}: {run.status}")
    print(f"{'step':>6}  {'class':<10} {'state':<8} {'tier':<8} {'eval_loss':>9}  labels")
    for checkpoint in run.checkpoints():
        loss = checkpoint.metrics.get("eval_loss")
        print(
            f"{checkpoint.step:>6}  {checkpoint.cls:<10} {checkpoint.state:<8} "
            f"{checkpoint.tier or '-':<8} {'' if loss is None else f'{loss:.4f}':>9}  "
            f"{checkpoint.labels}"
        )
    client.close()


if __name__ == "__main__":
    main()
