"""A Lightning training catalogued by the checkpoint service: the worked example of
`ckpt_client.lightning` (needs `pip install './client[lightning]'`).

    make run                                         # in one terminal: the service, CKPT_AUTH=off
    python examples/lightning_job.py                 # trains 40 steps, a checkpoint every 5
    python examples/lightning_job.py --steps 60      # again: resumes at step 40, goes on to 60

It asks the service for its tiers and writes under the hottest one's directory, where the
service finds the files (`./var/data/hot/<project>/<run>/` with `make run`). Every 5th step
is saved (`rolling`), every 20th is a `milestone`, the last save becomes `final`, and the
run ends `completed`. The service's default policy keeps the newest 3 rolling checkpoints
and deletes the older ones itself once they are a minute old (at its next sweep, or the
next registration); Lightning deletes nothing: `save_top_k=-1`. Run it twice: the second run resumes from the newest checkpoint the
catalog holds (`resume_path`), staged onto `hot` first if a policy moved it colder.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import ckpt_client
from ckpt_client import Client
from ckpt_client.lightning import CatalogCallback


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)  # sent with each checkpoint as a metric
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="lightning-demo")
    parser.add_argument("--run", default="run-1")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--url", help="the service (default CKPT_URL, else http://127.0.0.1:8000)")
    args = parser.parse_args()

    client = Client(args.url)
    hot = client.tiers()[0]
    if hot.local_path is None:
        parser.error(f"the hottest tier {hot.name} is not a local directory: {hot.url}")
    dirpath = hot.local_path / args.project / args.run

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        callbacks=[
            ModelCheckpoint(dirpath=dirpath, every_n_train_steps=5, save_top_k=-1),
            CatalogCallback(
                project=args.project, run_name=args.run, client=client, milestone_every_n_steps=20
            ),
        ],
    )
    resume = ckpt_client.resume_path(args.project, args.run, client=client)  # None the first time
    print(f"resuming from {resume}" if resume else "starting afresh")
    trainer.fit(Regression(), DataLoader(data, batch_size=32, shuffle=True), ckpt_path=resume)

    run = client.find_run(args.project, args.run)
    assert run is not None
    print(f"run {run.name}: {run.status}")
    for checkpoint in run.checkpoints():
        loss = checkpoint.metrics.get("train_loss")
        print(f"  step {checkpoint.step:>4}  {checkpoint.cls:<9} {checkpoint.state:<8} loss={loss}")
    client.close()


if __name__ == "__main__":
    main()
