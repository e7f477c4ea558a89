"""A backtest of one year over a catalog of 100,000 checkpoints (1,000 runs), on PostgreSQL.

Bulk-loads (COPY) a year of history: runs starting through the year, each with rolling
checkpoints every 12 hours (most of them purged by the policy in force a day later),
milestones every two days (cooled to `cold` after ten days) and a final one (copied to
`archive`); a tenth of the runs resumed from an earlier run's milestone; pins, a person's
deletes and restores. Then times `POST /v1/backtest` of policies/default.yaml over the
whole year (through the API, in process), and its parts: reading the history, the replay,
the two series. Checks the answer covers every run, checkpoint and day, that the candidate
acted, and that the actual series ends with the bytes the catalog holds.

    .venv/bin/python bench/backtest.py            # or: make bench-backtest

Target (issue 21): under 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from app.cost.backtest import Backtest  # noqa: E402
from app.cost.usage_series import usage_series  # noqa: E402
from app.db.migrate import upgrade  # noqa: E402
from app.db.session import make_engine, make_session_factory  # noqa: E402
from app.main import NO_BACKGROUND, create_app  # noqa: E402
from app.policy.loading import validate_policy  # noqa: E402
from app.services.cost.history import load_history  # noqa: E402
from app.services.cost.inputs import tier_prices  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.tiers_config import load_tiers  # noqa: E402
from bench.sweep import copy_rows  # noqa: E402

PG_HOST = os.environ.get("CKPT_BENCH_PG_HOST", "127.0.0.1")
ADMIN_DSN = f"host={PG_HOST} port=5432 user=postgres dbname=postgres"
YEAR_START = datetime(2025, 1, 6, tzinfo=UTC)
GB = 10**9


def build(conn: psycopg.Connection[Any], runs: int, per_run: int, rng: random.Random) -> int:
    """A year of history for `runs` runs of `per_run` checkpoints; returns the bytes the
    catalog holds at the end."""
    run_rows: list[tuple[Any, ...]] = []
    ckpts: list[tuple[Any, ...]] = []
    locations: list[tuple[Any, ...]] = []
    events: list[tuple[Any, ...]] = []
    actions: list[tuple[Any, ...]] = []
    milestones: list[str] = []
    held = 0

    def event(at: datetime, cid: str, run_id: str, name: str, after: dict[str, Any]) -> None:
        events.append((at, "bench", "checkpoint", cid, name, cid, run_id, json.dumps(after)))

    def placed(tiers: list[str]) -> dict[str, Any]:
        return {"locations": [{"tier": t, "role": "primary", "uri": "-"} for t in tiers]}

    for n in range(runs):
        run_id = f"run_{n:06d}{uuid.uuid4().hex[:10]}"
        started = YEAR_START + timedelta(hours=rng.randrange(0, 300 * 24))
        days = per_run // 2  # 12-hourly checkpoints
        ended = started + timedelta(days=days)
        resumed = rng.choice(milestones) if milestones and rng.random() < 0.1 else None
        run_rows.append((run_id, 1, f"run-{n}", "completed", "{}", None, resumed, started, ended))
        for k in range(per_run):
            created = started + timedelta(hours=12 * k)
            last = k == per_run - 1
            klass = "final" if last else ("milestone" if k % 4 == 3 else "rolling")
            cid = f"ckpt_{n:06d}{k:04d}{uuid.uuid4().hex[:8]}"
            size = rng.randrange(50, 150) * GB
            uri = f"file:///srv/ckpt/hot/bench/run-{n}/step-{k}"
            event(created, cid, run_id, "registered", {"tier": "hot", **placed(["hot"])})
            state, tiers = "active", ["hot"]
            if klass == "rolling" and k < per_run - 4:
                purge = created + timedelta(days=1)
                event(purge, cid, run_id, "purged", {"state": "deleted", "locations": []})
                state, tiers = "deleted", []
            elif klass == "milestone":
                milestones.append(cid)
                event(created + timedelta(days=10), cid, run_id, "moved", placed(["cold"]))
                tiers = ["cold"]
                roll = rng.random()
                if roll < 0.01:
                    event(created + timedelta(days=20), cid, run_id, "pinned", {"pinned": True})
                elif roll < 0.02:
                    at = created + timedelta(days=15)
                    actions.append((cid, run_id, "delete", "manual", at))
                    event(at, cid, run_id, "purged", {"state": "deleted", "locations": []})
                    state, tiers = "deleted", []
                elif roll < 0.03:
                    at = created + timedelta(days=25)
                    actions.append((cid, run_id, "restore", "manual", at, "hot"))
                    event(at, cid, run_id, "restored", placed(["cold", "hot"]))
                    tiers = ["cold", "hot"]
            elif last:
                event(ended, cid, run_id, "copied", placed(["hot", "archive"]))
                tiers = ["hot", "archive"]
            held += size * len(tiers)
            ckpts.append(
                (cid, run_id, k, klass, state, uri, size, json.dumps({"eval_loss": rng.random()}),
                 "{}", False, created, created, created)
            )  # fmt: skip
            for i, tier in enumerate(tiers):
                locations.append((cid, tier, f"{uri}#{tier}", "primary" if i == 0 else "replica"))
    copy_rows(conn, "runs", ["id", "project_id", "name", "status", "labels", "policy",
                             "resumed_from", "started_at", "ended_at"], run_rows)  # fmt: skip
    copy_rows(conn, "checkpoints", ["id", "run_id", "step", "class", "state", "uri",
                                    "size_bytes", "metrics", "labels", "pinned", "created_at",
                                    "registered_at", "committed_at"], ckpts)  # fmt: skip
    copy_rows(conn, "locations", ["checkpoint_id", "tier", "uri", "role"], locations)
    events.sort(key=lambda e: e[0])
    copy_rows(conn, "audit_events", ["at", "actor", "entity", "entity_id", "event",
                                     "checkpoint_id", "run_id", "after"], events)  # fmt: skip
    rows = [
        (uuid.uuid4().hex, a[0], a[1], a[2], None, a[5] if len(a) > 5 else None, a[3],
         "done", 1, 0, a[4], a[4], a[4], a[4])
        for a in actions
    ]  # fmt: skip
    copy_rows(conn, "actions", ["id", "checkpoint_id", "run_id", "kind", "from_tier", "to_tier",
                                "rule", "state", "attempts", "bytes", "due_at", "created_at",
                                "updated_at", "finished_at"], rows)  # fmt: skip
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--per-run", type=int, default=100)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    db = f"ckpt_bench_backtest_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    url = f"postgresql+psycopg://postgres@{PG_HOST}:5432/{db}"
    work = Path(os.environ.get("TMPDIR", "/tmp")) / db
    try:
        upgrade(url)
        with psycopg.connect(f"host={PG_HOST} port=5432 user=postgres dbname={db}") as conn:
            conn.execute("INSERT INTO projects (name, created_at) VALUES ('bench', now())")
            t0 = time.perf_counter()
            held = build(conn, args.runs, args.per_run, random.Random(21))
            conn.commit()
            conn.execute("ANALYZE")
            conn.commit()
            load_s = time.perf_counter() - t0
        settings = Settings(database_url=url, data_dir=work / "data",
                            policies_dir=work / "policies", auth="off")  # fmt: skip
        tiers = load_tiers(settings)
        policy = validate_policy(
            yaml.safe_load((ROOT / "policies/default.yaml").read_text()), [t.name for t in tiers]
        )
        engine = make_engine(url)
        app = create_app(settings, engine=engine, roles=NO_BACKGROUND)
        samples: list[float] = []
        with TestClient(app) as client:
            for _ in range(args.samples):
                t0 = time.perf_counter()
                answer = client.post(
                    "/v1/backtest",
                    json={"policy": policy.model_dump(mode="json", by_alias=True,
                                                      exclude_defaults=True)},
                )  # fmt: skip
                samples.append(time.perf_counter() - t0)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert body["runs"] == args.runs, body["runs"]
                assert body["checkpoints"] == args.runs * args.per_run, body["checkpoints"]
                assert body["actions"] > 0
                assert len(body["series"]) >= 365, len(body["series"])
                assert body["actual"]["series"][-1]["bytes"] == held
        # the parts, in process
        factory = make_session_factory(engine)
        with factory() as session:
            t0 = time.perf_counter()
            history = load_history(session, policy, project=None, run_id=None, projects=None)
            read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        replay = Backtest(policy, history.runs, history.checkpoints,
                          tier_ranks={t.name: t.rank for t in tiers},
                          trash_retention=timedelta(days=7))  # fmt: skip
        outcome = replay.play(history.events, datetime.now(UTC))
        replay_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        prices, names = tier_prices(tiers), [t.name for t in tiers]
        assert history.first is not None
        usage_series(outcome.deltas, prices, names, history.first, datetime.now(UTC))
        usage_series(history.actual, prices, names, history.first, datetime.now(UTC))
        series_s = time.perf_counter() - t0
        engine.dispose()
        result = {
            "machine": f"{platform.node()} {os.cpu_count()} cpu, {platform.python_version()}",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "runs": args.runs,
            "checkpoints": args.runs * args.per_run,
            "history_events": len(history.events),
            "audit_rows": len(history.actual),
            "load_s": round(load_s, 1),
            "backtest_s": [round(s, 2) for s in samples],
            "best_s": round(min(samples), 2),
            "read_history_s": round(read_s, 2),
            "replay_s": round(replay_s, 2),
            "evaluations": outcome.evaluations,
            "candidate_actions": outcome.actions,
            "series_s": round(series_s, 2),
            "target_s": 30,
            "met": min(samples) < 30,
        }
        print(json.dumps(result, indent=2))
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (out / f"backtest-{stamp}.json").write_text(json.dumps(result, indent=2))
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
