"""What `ckpt_client.transformers.CatalogCallback` adds to a save of the Hugging Face
Trainer: the same training with and without it, in one run, against `ckpt api` on
PostgreSQL.

    .venv/bin/python bench/transformers_save.py [--saves 20] [--rounds 3] [--width 256]

The Trainer saves synchronously and calls `on_save` once the directory is written. The
callback's `on_save` takes the directory's manifest and hands the registration to a thread
of its own, so what it adds to a save on the training's thread is the time spent in
`on_save` (more when the save before is still being registered); the benchmark times that,
and the Trainer's own `_save_checkpoint`, per save. The trainings' wall time per save, with
and without the callback, is shown beside it as a cross-check: it also carries what the
service (on the same two cores here) and the registering thread take from the training,
and the disk's moods, so it is the noisier figure. An untimed training takes the warming
up; then the peers alternate for `--rounds` rounds. A GPT-2 of width 256 and 8 layers over
a vocabulary of 8,192 saves about 100 MB a checkpoint (weights, and Adam's two moments).

This process (the project's Python) makes a database, starts the service and runs the
trainings with the frameworks' Python (`CKPT_FRAMEWORKS_PYTHON`, else the one
tests/frameworks/env.sh builds), which runs this same file with `--train`. It prints a
table, writes `bench/results/transformers-<UTC time>.json`, and exits 1 when the
callback's median cost per save is over 1 % of the save or any save's over 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIMIT_SHARE = 0.01  # of the save's own time
LIMIT_SECONDS = 0.050  # per save, whatever its size
PEERS = ("bare", "catalog")  # the same training without the callback, and with it


def train(options: argparse.Namespace) -> None:
    """Run with the frameworks' Python: both trainings, one JSON line of timings out."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from ckpt_client.transformers import CatalogCallback

    class TimedTrainer(Trainer):  # type: ignore[misc]
        saves: list[float]

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            started = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.saves.append(time.perf_counter() - started)

    class TimedCallback(CatalogCallback):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.times: dict[str, list[float]] = {"begin": [], "save": [], "end": []}

        def _timed(self, event: str, call: Any, *args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            call(*args, **kwargs)
            self.times[event].append(time.perf_counter() - started)

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self._timed("begin", super().on_train_begin, *args, **kwargs)

        def on_save(self, *args: Any, **kwargs: Any) -> None:
            self._timed("save", super().on_save, *args, **kwargs)

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self._timed("end", super().on_train_end, *args, **kwargs)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
        def __init__(self, vocab: int) -> None:
            generator = torch.Generator().manual_seed(1)
            self.ids = torch.randint(0, vocab, (64, 32), generator=generator)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    config = GPT2Config(
        vocab_size=options.vocab,
        n_positions=32,
        n_embd=options.width,
        n_layer=options.layers,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dt%H%M%S")
    result: dict[str, Any] = {"bare": [], "catalog": []}
    # An untimed training first takes the warming up; then the peers alternate, round by
    # round, so that a noisy neighbour or the disk's write-back hits both alike.
    order = ["warm-up"] + [p for r in range(options.rounds) for p in PEERS[:: 1 - 2 * (r % 2)]]
    for number, peer in enumerate(order):
        torch.manual_seed(0)
        name = f"hf-{peer}-{stamp}-{number}"
        args = TrainingArguments(
            output_dir=str(options.output_root / name),
            max_steps=options.saves,
            save_steps=1,
            save_total_limit=None,
            per_device_train_batch_size=2,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        callback = TimedCallback("bench", name) if peer == "catalog" else None
        trainer = TimedTrainer(
            model=GPT2LMHeadModel(config),
            args=args,
            train_dataset=Tokens(options.vocab),
            callbacks=[callback] if callback else [],
        )
        trainer.saves = []
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        first = Path(args.output_dir) / "checkpoint-1"
        result["checkpoint_bytes"] = sum(p.stat().st_size for p in first.rglob("*"))
        shutil.rmtree(args.output_dir)  # a round's gigabyte, not the whole run's
        if peer != "warm-up":
            timings = {"wall_s": wall, "save_s": trainer.saves}
            result[peer].append(timings | ({"callback_s": callback.times} if callback else {}))
    print(json.dumps(result), flush=True)


def frameworks_python() -> str:
    given = os.environ.get("CKPT_FRAMEWORKS_PYTHON")
    if given:
        return given
    built = subprocess.run(
        ["bash", str(ROOT / "tests/frameworks/env.sh")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip().splitlines()[-1]


def summarise(result: dict[str, Any], saves: int) -> dict[str, Any]:
    catalog, bare = result["catalog"], result["bare"]
    on_save = sorted(t for r in catalog for t in r["callback_s"]["save"])
    save = statistics.median(t for r in catalog + bare for t in r["save_s"])
    median = statistics.median(on_save)

    def wall_per_save(rounds: list[dict[str, Any]]) -> float:
        return float(statistics.median(r["wall_s"] for r in rounds)) / saves

    return {
        "checkpoint_mb": result["checkpoint_bytes"] / 1e6,
        "save_median_ms": save * 1e3,
        "on_save_median_ms": median * 1e3,
        "on_save_p90_ms": on_save[int(0.9 * (len(on_save) - 1))] * 1e3,
        "on_save_max_ms": on_save[-1] * 1e3,
        "on_save_share_pct": 100 * median / save,
        "train_begin_median_ms": statistics.median(r["callback_s"]["begin"][0] for r in catalog)
        * 1e3,
        "train_end_median_ms": statistics.median(r["callback_s"]["end"][0] for r in catalog) * 1e3,
        "wall_per_save_bare_ms": wall_per_save(bare) * 1e3,
        "wall_per_save_catalog_ms": wall_per_save(catalog) * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=20, help="saves per training")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3, help="trainings per peer")
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output-root", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.train:
        train(options)
        return 0

    sys.path.insert(0, str(ROOT))
    from bench.register import Server, create_database, drop_database, git_describe

    python = frameworks_python()
    dbname = create_database()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-hf-") as tmp:
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
            command = [python, __file__, "--train", "--output-root", str(data_dir / "hot/bench")]
            for name in ("saves", "width", "layers", "vocab", "rounds"):
                command += [f"--{name}", str(getattr(options, name))]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-6000:], file=sys.stderr)
                return 2
        finally:
            server.stop()
            drop_database(dbname)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    summary = summarise(result, options.saves)
    for key, value in summary.items():
        print(f"{key:>30}  {value:10.2f}")
    verdict = (
        summary["on_save_share_pct"] <= 100 * LIMIT_SHARE
        and summary["on_save_max_ms"] <= 1e3 * LIMIT_SECONDS
    )
    print("PASS" if verdict else "FAIL", "(target: median under 1 % of a save, none over 50 ms)")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"code": git_describe(), "options": vars(options) | {"output_root": None}}
    (out / f"transformers-{stamp}.json").write_text(
        json.dumps({**report, "summary": summary, "raw": result}, indent=2, default=str)
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
