"""A JAX training that checkpoints with orbax, catalogued by the checkpoint service: the
worked example of `ckpt_client.orbax` (needs `pip install './client[orbax]'`).

    make run                                   # in one terminal: the service, CKPT_AUTH=off
    python examples/orbax_job.py               # 40 steps, an asynchronous save every 5
    python examples/orbax_job.py --steps 60    # again: restores the newest save, goes on to 60

It asks the service for its tiers and gives orbax a directory under the hottest one
(`./var/data/hot/<project>/<run>/<step>/` with `make run`). Each save is reserved as soon
as orbax's blocking part returns, written in orbax's background threads while training
goes on, and committed once orbax has renamed it into place; the last one is made
`final`. orbax deletes nothing (`max_to_keep` is forced off): the service's policy decides
what stays (the default keeps the newest 3 rolling saves). When the newest checkpoint was
moved to a colder tier, `resume_path` stages it back onto `hot` as `step-<n>` and
`restore_from` reads it there.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

import ckpt_client
from ckpt_client import Client
from ckpt_client.orbax import CatalogCheckpointManager, step_of


def loss_of(params: dict[str, Any], x: Any, y: Any) -> Any:
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="orbax-demo")
    parser.add_argument("--run", default="run-1")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--url", help="the service (default CKPT_URL, else http://127.0.0.1:8000)")
    args = parser.parse_args()

    client = Client(args.url)
    hot = client.tiers()[0]
    if hot.local_path is None:
        parser.error(f"the hottest tier {hot.name} is not a local directory: {hot.url}")
    root: Path = hot.local_path / args.project / args.run

    key_x, key_y = jax.random.split(jax.random.PRNGKey(0))
    x, y = jax.random.normal(key_x, (512, 8)), jax.random.normal(key_y, (512, 1))
    params = {"w": jnp.zeros((8, 1)), "b": jnp.zeros((1,))}
    grad = jax.jit(jax.value_and_grad(loss_of))
    options = ocp.CheckpointManagerOptions(save_interval_steps=args.every)  # no max_to_keep
    with CatalogCheckpointManager(
        root, options, project=args.project, run_name=args.run, client=client
    ) as mngr:
        start = 0
        resume = ckpt_client.resume_path(args.project, args.run, client=client)  # None at first
        if resume is not None:
            step = step_of(resume)
            assert step is not None, resume
            target = ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, params))
            if Path(resume) == root / str(step):
                params = mngr.restore(step, args=target)  # orbax's own step directory
            else:
                params = mngr.restore_from(resume, target)  # a copy staged back: step-<n>
            start = step
            print(f"resumed from step {start}: {resume}")
        for step in range(start + 1, args.steps + 1):
            loss, grads = grad(params, x, y)
            params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
            # saves every `every` steps (orbax's save_interval_steps), and the last one
            mngr.save(
                step,
                args=ocp.args.StandardSave(params),
                metrics={"train_loss": float(loss)},
                force=step == args.steps,
            )
        run = mngr.run
    # close() (the end of the with) waited for every save to be committed, or spooled
    assert run is not None
    last = run.latest()
    if last is not None and last.step == args.steps:
        client.update_checkpoint(last.id, cls="final")
    run.complete()

    print(f"run {run.name}: {run.refresh().status}")
    for checkpoint in run.checkpoints():
        loss_at = checkpoint.metrics.get("train_loss")
        print(
            f"  step {checkpoint.step:>4}  {checkpoint.cls:<9} {checkpoint.state:<8} loss={loss_at}"
        )
    client.close()


if __name__ == "__main__":
    main()
