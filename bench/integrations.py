"""What each training integration adds to a save: the same training with and without it,
for Lightning (plain and under `AsyncCheckpointIO`), torch.distributed.checkpoint
(`async_save`, thread mode), the Hugging Face Trainer and Orbax's `CheckpointManager`
(asynchronous), in one run, against `ckpt api`
on PostgreSQL, each saving about 100 MB on local disk at every step.

    .venv/bin/python bench/integrations.py [--saves 20] [--rounds 3] [--only dcp ...]

The figure is the time the integration's own code holds the training thread per save
(reserve, commit and the calls around them; the keepalive runs on a thread of its own):
its entry points timed from outside, less the framework's own calls inside them (see
bench/integration_trainings.py, which runs with the frameworks' Python). What a writer
thread spends on the catalog (Lightning's asynchronous IO) is shown beside it, and the
trainings' wall time per save with and without the integration as a cross-check: it also
carries what the service (on the same two cores here) takes from the training, so it is
the noisier figure. The run's start and end (creating and ending the run) happen once a
training and are shown apart.

Target (issue 16): the median under 1 % of the framework's own save of the same
checkpoint, and no save over 50 ms. It prints a table, writes
`bench/results/integrations-<UTC time>.json`, and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAININGS = ROOT / "bench" / "integration_trainings.py"
FRAMEWORKS = ("lightning", "dcp", "transformers", "orbax")
LIMIT_SHARE = 0.01  # of the framework's own save
LIMIT_SECONDS = 0.050  # per save, whatever its size


def frameworks_python() -> str:
    given = os.environ.get("CKPT_FRAMEWORKS_PYTHON")
    if given:
        return given
    built = subprocess.run(
        ["bash", str(ROOT / "tests/frameworks/env.sh")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip().splitlines()[-1]


def summarise(name: str, result: dict[str, Any], saves: int) -> dict[str, Any]:
    """One row: per-save figures in milliseconds."""
    catalog, bare = result["catalog"], result["bare"]
    save = statistics.median(t for r in catalog + bare for t in r["save_s"])
    per_save = [sum(r.get("added_s", [])) / saves for r in catalog]
    calls = sorted(t for r in catalog for t in r.get("added_s", []))
    added = statistics.median(per_save)
    row: dict[str, Any] = {
        "integration": name,
        "checkpoint_mb": result["checkpoint_bytes"] / 1e6,
        "save_ms": save * 1e3,
        "added_ms": added * 1e3,
        "added_max_ms": (calls[-1] if calls else 0.0) * 1e3,
        "share_pct": 100 * added / save,
        "run_start_end_ms": statistics.median(sum(r.get("run_s", [])) for r in catalog) * 1e3,
        "wall_bare_ms": statistics.median(r["wall_s"] for r in bare) / saves * 1e3,
        "wall_catalog_ms": statistics.median(r["wall_s"] for r in catalog) / saves * 1e3,
    }
    writer = [
        w - s for r in catalog for w, s in zip(r.get("writer_s", []), r["save_s"], strict=False)
    ]
    if writer:
        row["writer_added_ms"] = statistics.median(writer) * 1e3
    row["pass"] = (
        row["share_pct"] <= 100 * LIMIT_SHARE and row["added_max_ms"] <= 1e3 * LIMIT_SECONDS
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=20, help="saves per training")
    parser.add_argument("--rounds", type=int, default=3, help="trainings per peer")
    parser.add_argument("--only", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.register import Server, create_database, drop_database, git_describe

    python = frameworks_python()
    dbname = create_database()
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-integrations-") as tmp:
        data_dir = Path(tmp) / "data"
        server = Server(dbname, data_dir, 1, Path(tmp) / "server.log")
        try:
            server.wait_healthy()
            env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
            env.update(
                CKPT_URL=f"http://127.0.0.1:{server.port}",
                CKPT_SPOOL_DIR=str(Path(tmp) / "spool"),
                PYTHONPATH=str(ROOT / "client" / "src"),
                CUDA_VISIBLE_DEVICES="",
                OMP_NUM_THREADS="1",  # the service and PostgreSQL share the two cores
                HF_HUB_OFFLINE="1",
            )
            for framework in options.only:
                command = [python, str(TRAININGS), framework]
                command += ["--output-root", str(data_dir / "hot" / "bench")]
                command += ["--saves", str(options.saves), "--rounds", str(options.rounds)]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-6000:], file=sys.stderr)
                    return 2
                raw[framework] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            server.stop()
            drop_database(dbname)
    rows = []
    for framework, result in raw.items():
        if framework == "lightning":
            rows += [
                summarise(f"lightning-{m}", result[m], options.saves) for m in ("plain", "async")
            ]
        else:
            rows.append(summarise(framework, result, options.saves))
    columns = [k for k in rows[0] if k != "integration"]
    print(f"{'integration':<16}" + "".join(f"{c:>18}" for c in columns))
    for row in rows:
        cells = "".join(
            f"{row.get(c, float('nan')):>18.2f}" if c != "pass" else f"{row[c]!s:>18}"
            for c in columns
        )
        print(f"{row['integration']:<16}{cells}")
    verdict = all(row["pass"] for row in rows)
    print("PASS" if verdict else "FAIL", "(target: median under 1 % of a save, none over 50 ms)")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"code": git_describe(), "options": vars(options), "rows": rows, "raw": raw}
    (out / f"integrations-{stamp}.json").write_text(json.dumps(report, indent=2, default=str))
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
