"""A tiny JAX training that checkpoints with orbax through `ckpt_client.orbax`, on the CPU:
a pytree of two arrays, one deterministic update per step, an asynchronous save every
`--save-every` steps.

    orbax_train.py --project P --run R --root DIR --steps N --save-every K
                   [--resume] [--hold-at STEP --gate FILE] [--block-at STEP]
                   [--fail-at STEP] [--deadline S] [--max-to-keep N] [--sync] [--attached]

It prints a line per event, for the test to read: `SAVED <step> <checksum>` when a save
returns, `CATALOG <step> ORBAX <step>` first when it resumes (what `resume_step()` and orbax's
`latest_step()` say), `RESUME <path>` and `START <step> <checksum>` when it resumed (`--resume`:
`ckpt_client.resume_path`, then `restore` for one of the manager's own step directories
or `restore_from` for a copy the service staged), `AT <step>` when it holds (`--hold-at`:
every save so far finished and catalogued, it waits for `--gate` to exist), `BLOCKED
<step>` when the save of `--block-at` is written and finalized but not yet renamed into
place (it blocks there for good, in orbax's post-finalization callback, to be killed), and
`FAILED <step> <error>` when the save of `--fail-at` failed (an injected full disk, in
the same callback), and `DONE <step>` at the end, after the run is completed.
`--max-to-keep` is handed to orbax (the manager must ignore it); `--sync` saves
synchronously; `--attached` hands the manager a run attached beforehand (`run=`) instead
of its project and name.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

import ckpt_client
from ckpt_client.orbax import CatalogCheckpointManager, step_of


def initial() -> dict[str, Any]:
    state: dict[str, Any] = {
        "w": jnp.ones((4, 4), dtype=jnp.float32),
        "b": jnp.zeros((4,), dtype=jnp.float32),
    }
    return state


def update(state: dict[str, Any], step: int) -> dict[str, Any]:
    """One training step: deterministic, so a resumed run must land where one that never
    stopped would."""
    updated: dict[str, Any] = jax.tree.map(lambda x: x * 0.99 + 0.01 * step, state)
    return updated


def checksum(state: dict[str, Any]) -> str:
    return f"{float(sum(jnp.sum(x) for x in jax.tree.leaves(state))):.6f}"


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--hold-at", type=int, default=-1)
    parser.add_argument("--gate")
    parser.add_argument("--block-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--max-to-keep", type=int)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--attached", action="store_true")
    args = parser.parse_args()

    root = Path(args.root)
    saving: list[int] = []  # the steps handed to save(), oldest first (one in flight)

    def after_finalization() -> None:  # orbax calls it before the rename into place
        step = saving.pop(0)
        if step == args.fail_at:
            raise OSError(28, f"No space left on device (injected at step {step})")
        if step == args.block_at:
            say(f"BLOCKED {args.block_at}")
            while True:
                time.sleep(3600)

    options = ocp.CheckpointManagerOptions(
        max_to_keep=args.max_to_keep,
        enable_async_checkpointing=not args.sync,
        async_options=ocp.AsyncOptions(post_finalization_callback=after_finalization)
        if not args.sync
        else None,
    )
    client = ckpt_client.Client(deadline=args.deadline)
    state = initial()
    start = 0
    catalogue: dict[str, Any] = {"project": args.project, "run_name": args.run, "client": client}
    if args.attached:  # a run attached beforehand, as a benchmark hands it over
        catalogue = {"run": client.run(args.project, args.run)}
    with CatalogCheckpointManager(root, options, **catalogue) as mngr:
        if args.resume:
            say(f"CATALOG {mngr.resume_step()} ORBAX {mngr.latest_step()}")
            path = ckpt_client.resume_path(args.project, args.run, client=client)
            if path is not None:
                say(f"RESUME {path}")
                step = step_of(path)
                assert step is not None, path
                target = ocp.args.StandardRestore(
                    jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
                )
                if Path(path) == root / str(step):
                    state = mngr.restore(step, args=target)
                else:  # a copy the service staged: step-<N>, not a name orbax reads
                    state = mngr.restore_from(path, target)
                start = step
                say(f"START {start} {checksum(state)}")
        for step in range(start + 1, args.steps + 1):
            state = update(state, step)
            if step == args.hold_at:
                mngr.wait_until_finished()
                mngr.wait_for_catalog()
                say(f"AT {step}")
                while not Path(args.gate).exists():
                    time.sleep(0.05)
            if step % args.save_every == 0:
                saving.append(step)
                mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": 1.0 / step})
                say(f"SAVED {step} {checksum(state)}")
                if step == args.fail_at:
                    try:
                        mngr.wait_until_finished()
                    except OSError as error:
                        say(f"FAILED {step} {error}")
        mngr.wait_until_finished()
        run = mngr.run
    assert run is not None
    run.complete()  # after close(): every save catalogued (or spooled) first
    client.close()
    say(f"DONE {args.steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
