"""A simulated training job: the worked example of the design, end to end on local tiers.

A 45-day run writes a rolling checkpoint every 3 hours, a milestone every day and a
final at the end. The clock is simulated by back-dating `created_at` (the run started
76 days ago and ended 31 days ago), so thinning and cooling happen at once.

    make run                              # in one terminal
    .venv/bin/python examples/simulated_job.py [--days 45] [--url http://127.0.0.1:8000]

With access control on, give it an admin token (it sweeps and approves held deletes):
`--token SECRET`, or CKPT_TOKEN in the environment.

It prints how many rolling checkpoints are on disk as the run goes (at most 3 plus the
one being written), then the plan, the ledger, and where every checkpoint ended up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

OPEN = ("held", "pending", "running")
TOKEN: str | None = None  # set from --token


def call(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if TOKEN:
        headers["authorization"] = f"Bearer {TOKEN}"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        raise SystemExit(f"{method} {path}: {error.code} {error.read().decode()}") from None
    return json.loads(raw) if raw else None


def write_checkpoint(root: Path, size: int) -> list[dict[str, Any]]:
    """Two shards with random bytes; the manifest carries their sha256."""
    files = []
    for name in ("model.safetensors", "optimizer/state.pt"):
        payload = os.urandom(size)
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(payload)
        files.append(
            {"path": name, "size_bytes": size, "sha256": hashlib.sha256(payload).hexdigest()}
        )
    return files


def wait_for_ledger(base: str, run_id: str, timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        actions = call(base, "GET", f"/v1/actions?run_id={run_id}&limit=1000")["items"]
        busy = [a for a in actions if a["state"] in ("pending", "running")]
        if not busy or time.monotonic() > deadline:
            return actions
        time.sleep(0.5)


def on_disk(hot: Path, steps: set[int]) -> int:
    return sum(1 for step in steps if (hot / f"step-{step}").exists())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data-dir", type=Path, default=Path("var/data"))
    parser.add_argument("--project", default="llama-70b")
    parser.add_argument("--days", type=int, default=45)
    parser.add_argument("--bytes", type=int, default=4096, help="size of each shard")
    parser.add_argument("--token", default=os.environ.get("CKPT_TOKEN"), help="an admin token")
    args = parser.parse_args()
    global TOKEN
    TOKEN = args.token
    base = args.url.rstrip("/")
    now = datetime.now(UTC)
    started = now - timedelta(days=args.days + 31)
    name = f"run-{now:%Y%m%d-%H%M%S}"
    run = call(
        base,
        "POST",
        "/v1/runs",
        {"project": args.project, "name": name, "started_at": started.isoformat()},
    )
    hot = (args.data_dir / "hot" / args.project / name).resolve()
    print(f"run {run['id']} ({args.project}/{name}), {args.days} simulated days")

    step = 0
    rolling_steps: set[int] = set()
    for day in range(1, args.days + 1):
        for hour in range(3, 25, 3):
            step += 500
            at = started + timedelta(days=day - 1, hours=hour)
            klass = "milestone" if hour == 24 else "rolling"
            if klass == "rolling":
                rolling_steps.add(step)
            root = hot / f"step-{step}"
            files = write_checkpoint(root, args.bytes)
            call(
                base,
                "POST",
                f"/v1/runs/{run['id']}/checkpoints",
                {
                    "step": step,
                    "class": klass,
                    "uri": f"file://{root}",
                    "files": files,
                    "created_at": at.isoformat(),
                    "metrics": {"eval_loss": random.uniform(1.5, 3.0)},
                },
            )
        # Each registration already queued an evaluation of the run; a synchronous sweep
        # of the run makes the day's end deterministic for this printout.
        call(base, "POST", "/v1/sweeps", {"run_id": run["id"]})
        wait_for_ledger(base, run["id"])
        query = f"/v1/runs/{run['id']}/checkpoints?class=rolling&state=active"
        active = len(call(base, "GET", query)["items"])
        print(
            f"day {day:2d}: step {step:6d}, rolling checkpoints active: {active}, "
            f"on disk: {on_disk(hot, rolling_steps)}"
        )

    step += 500
    root = hot / f"step-{step}"
    call(
        base,
        "POST",
        f"/v1/runs/{run['id']}/checkpoints",
        {
            "step": step,
            "class": "final",
            "uri": f"file://{root}",
            "files": write_checkpoint(root, args.bytes),
            "created_at": (started + timedelta(days=args.days)).isoformat(),
        },
    )
    ended = started + timedelta(days=args.days, minutes=5)
    call(
        base,
        "PATCH",
        f"/v1/runs/{run['id']}",
        {"status": "completed", "ended_at": ended.isoformat()},
    )
    print(f"run completed {ended:%Y-%m-%d} (31 days ago)")

    plan = call(base, "POST", "/v1/plan", {"run_id": run["id"]})
    kinds: dict[str, int] = {}
    for action in plan["actions"]:
        kinds[action["kind"]] = kinds.get(action["kind"], 0) + 1
    print(f"plan: {kinds}; totals {plan['totals']}")
    sweep = call(base, "POST", "/v1/sweeps", {"run_id": run["id"]})
    held = call(base, "GET", f"/v1/actions?run_id={run['id']}&state=held&limit=1000")["items"]
    if held:
        print(
            f"{len(held)} deletes held by the blast-radius guard (more than half of the "
            "project's checkpoints); approving them as an admin would"
        )
        for action in held:
            call(base, "POST", f"/v1/actions/{action['id']}/approve")
    actions = wait_for_ledger(base, run["id"])
    by_state: dict[str, int] = {}
    for action in actions:
        key = f"{action['kind']} {action['state']}"
        by_state[key] = by_state.get(key, 0) + 1
    print(f"sweep {sweep['id']}; ledger: {by_state}")

    live = call(base, "GET", f"/v1/runs/{run['id']}/checkpoints?limit=1000")["items"]
    summary: dict[str, int] = {}
    for checkpoint in live:
        tiers = "+".join(sorted(loc["tier"] for loc in checkpoint["locations"])) or "-"
        key = f"{checkpoint['class']:9s} {checkpoint['state']:8s} {tiers}"
        summary[key] = summary.get(key, 0) + 1
    for key, count in sorted(summary.items()):
        print(f"  {count:4d}  {key}")


if __name__ == "__main__":
    main()
