"""A torch.distributed.checkpoint training catalogued by the checkpoint service: the worked
example of `ckpt_client.dcp` (needs `pip install './client[torch]'`).

    make run                                   # in one terminal: the service, CKPT_AUTH=off
    python examples/dcp_job.py                 # 40 steps, an asynchronous save every 5
    python examples/dcp_job.py --steps 60      # again: loads the newest save, goes on to 60

It asks the service for its tiers and saves under the hottest one's directory
(`./var/data/hot/<project>/<run>/step-<n>/` with `make run`). Each save is reserved, written
by DCP in the background while training goes on, and committed with the files it wrote
when the upload completes; the last one becomes `final`. DCP deletes nothing: the
service's policy decides what stays (the default keeps the newest 3 rolling saves).
One process, gloo; with torchrun every rank runs the same lines, and only rank 0 (the one
given a `run`) talks to the service.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import ckpt_client
import ckpt_client.dcp
from ckpt_client import Client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="dcp-demo")
    parser.add_argument("--run", default="run-1")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--url", help="the service (default CKPT_URL, else http://127.0.0.1:8000)")
    args = parser.parse_args()

    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    client = Client(args.url)
    hot = client.tiers()[0]
    if hot.local_path is None:
        parser.error(f"the hottest tier {hot.name} is not a local directory: {hot.url}")
    root: Path = hot.local_path / args.project / args.run
    run = client.run(args.project, args.run)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    start = 0
    resume = ckpt_client.resume_path(args.project, args.run, client=client)  # None at first
    if resume is not None:
        dcp.load(state, checkpoint_id=resume)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"resumed from step {start}: {resume}")

    pending: ckpt_client.dcp.SaveFuture | None = None
    x, y = torch.randn(512, 8), torch.randn(512, 1)
    for step in range(start + 1, args.steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            if pending is not None:
                pending.result()  # one save in flight at a time, as DCP advises
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            last = step == args.steps
            pending = ckpt_client.dcp.async_save(
                state,
                run=run,
                step=step,
                checkpoint_id=root / f"step-{step}",
                cls="final" if last else "rolling",
                metrics={"train_loss": loss.item()},
            )
    if pending is not None:
        pending.result()
    run.complete()

    print(f"run {run.name}: {run.refresh().status}")
    for checkpoint in run.checkpoints():
        loss_at = checkpoint.metrics.get("train_loss")
        print(
            f"  step {checkpoint.step:>4}  {checkpoint.cls:<9} {checkpoint.state:<8} loss={loss_at}"
        )
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
