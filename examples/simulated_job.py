"""A simulated training job: the worked example of the design, end to end, through the
Python client (`pip install ./client`, or `make` for the whole project).

A 45-day run writes a rolling checkpoint every 3 hours, a milestone every day and a
final at the end. The clock is simulated by back-dating the run's start and each
checkpoint's `created_at` (the run started 76 days ago and ended 31 days ago), so
thinning and cooling happen at once.

    make run                              # in one terminal
    .venv/bin/python examples/simulated_job.py [--days 45] [--url http://127.0.0.1:8000]

It works against whatever tiers the service has: it asks for them and writes each step
under the hottest tier's url, where the service itself would place it. On a local
(`file://`) tier it writes the bytes; on an object store it registers the manifest only
(this example brings no object-store library), so the catalog and the plan are right but
the moves of bytes that were never written fail in the ledger.

With access control on, give it an admin token (it sweeps and approves held deletes):
`--token SECRET`, or CKPT_TOKEN in the environment.

It prints how many rolling checkpoints are active and on disk as the run goes (at most 3
plus the one being written), then the plan, the ledger, and where every checkpoint ended.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ckpt_client import Client, Run, Tier

SHARDS = ("model.safetensors", "optimizer/state.pt")


def write_step(hot: Tier, run: Run, step: int, size: int) -> tuple[str, list[dict[str, Any]]]:
    """The step's uri on the hot tier and its manifest (sha256 of random bytes); the bytes
    are written when the tier is a local directory."""
    uri = hot.uri_for(run.project, run.name, step)
    base = hot.local_path
    root = base / run.project / run.name / f"step-{step}" if base is not None else None
    files = []
    for name in SHARDS:
        payload = os.urandom(size)
        if root is not None:
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        files.append({"path": name, "size_bytes": size, "sha256": digest})
    return uri, files


def wait_for_ledger(client: Client, run: Run, timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        query = {"run_id": run.id, "limit": 1000}
        actions: list[dict[str, Any]] = client.call("GET", "/v1/actions", params=query)["items"]
        busy = [a for a in actions if a["state"] in ("pending", "running")]
        if not busy or time.monotonic() > deadline:
            return actions
        time.sleep(0.5)


def on_disk(hot: Tier, run: Run, steps: set[int]) -> int | str:
    if hot.local_path is None:
        return "-"
    base = hot.local_path / run.project / run.name
    return sum(1 for step in steps if (base / f"step-{step}").exists())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=None, help="default: CKPT_URL, else 127.0.0.1:8000")
    parser.add_argument("--token", default=None, help="an admin token (default: CKPT_TOKEN)")
    parser.add_argument("--project", default="llama-70b")
    parser.add_argument("--days", type=int, default=45)
    parser.add_argument("--bytes", type=int, default=4096, help="size of each shard")
    args = parser.parse_args()
    # A simulation wants to hear at once that the service is not there: no spooling.
    client = Client(args.url, token=args.token, on_unavailable="raise", deadline=10)
    hot = client.tiers()[0]
    now = datetime.now(UTC)
    started = now - timedelta(days=args.days + 31)
    name = f"run-{now:%Y%m%d-%H%M%S}"
    run = client.run(args.project, name, started_at=started)
    print(f"run {run.id} ({args.project}/{name}), {args.days} simulated days on tier {hot.name}")
    if hot.local_path is None:
        print(f"  {hot.url} is an object store: manifests only, no bytes written")

    step = 0
    rolling_steps: set[int] = set()
    for day in range(1, args.days + 1):
        for hour in range(3, 25, 3):
            step += 500
            cls = "milestone" if hour == 24 else "rolling"
            if cls == "rolling":
                rolling_steps.add(step)
            uri, files = write_step(hot, run, step, args.bytes)
            run.register(
                step,
                uri,
                cls=cls,
                files=files,
                created_at=started + timedelta(days=day - 1, hours=hour),
                metrics={"eval_loss": random.uniform(1.5, 3.0)},
            )
        # Each registration already queued an evaluation of the run; a synchronous sweep
        # of the run makes the day's end deterministic for this printout.
        client.call("POST", "/v1/sweeps", json={"run_id": run.id})
        wait_for_ledger(client, run)
        active = sum(1 for _ in run.checkpoints(cls="rolling", state="active"))
        print(
            f"day {day:2d}: step {step:6d}, rolling checkpoints active: {active}, "
            f"on disk: {on_disk(hot, run, rolling_steps)}"
        )

    step += 500
    uri, files = write_step(hot, run, step, args.bytes)
    final_at = started + timedelta(days=args.days)
    run.register(step, uri, cls="final", files=files, created_at=final_at)
    ended = started + timedelta(days=args.days, minutes=5)
    run.complete(ended_at=ended)
    print(f"run completed {ended:%Y-%m-%d} (31 days ago)")

    plan = client.call("POST", "/v1/plan", json={"run_id": run.id})
    kinds: dict[str, int] = {}
    for action in plan["actions"]:
        kinds[action["kind"]] = kinds.get(action["kind"], 0) + 1
    print(f"plan: {kinds}; totals {plan['totals']}")
    sweep = client.call("POST", "/v1/sweeps", json={"run_id": run.id})
    held = client.call(
        "GET", "/v1/actions", params={"run_id": run.id, "state": "held", "limit": 1000}
    )["items"]
    if held:
        print(
            f"{len(held)} deletes held by the blast-radius guard (more than half of the "
            "project's checkpoints); approving them as an admin would"
        )
        for action in held:
            client.call("POST", f"/v1/actions/{action['id']}/approve")
    by_state: dict[str, int] = {}
    for action in wait_for_ledger(client, run):
        key = f"{action['kind']} {action['state']}"
        by_state[key] = by_state.get(key, 0) + 1
    print(f"sweep {sweep['id']}; ledger: {by_state}")

    summary: dict[str, int] = {}
    for checkpoint in run.checkpoints():
        tiers = "+".join(sorted(loc.tier for loc in checkpoint.locations)) or "-"
        key = f"{checkpoint.cls:9s} {checkpoint.state:8s} {tiers}"
        summary[key] = summary.get(key, 0) + 1
    for key, count in sorted(summary.items()):
        print(f"  {count:4d}  {key}")
    resume = run.resume_point()
    if resume is not None:
        where = resume.local_path or resume.uri
        print(f"a restarted job would resume from step {resume.step}: {where}")
    client.close()


if __name__ == "__main__":
    main()
