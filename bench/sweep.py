"""Sweep and evaluation cost against catalog size, on PostgreSQL.

Bulk-loads a synthetic catalog (COPY) in three sizes, 100k, 300k and 1M active
checkpoints (100 per run, so 1,000 / 3,000 / 10,000 runs), and at each size times
  - a full dry-run plan of the whole catalog under policies/default.yaml (`POST /v1/plan`:
    every kept checkpoint with its reasons), and the same plan as a sweep makes it after a
    policy edit (actions only, with each run's next due time),
  - that dry run asked of `ckpt api` over HTTP (`POST /v1/plan` with no scope, as `ckpt
    plan` asks it), from the request to the answer's last byte, checked to hold the same
    actions and kept checkpoints: first of a server just started, then (`--warm-plans`,
    2 by default) again of the same server, as a long-lived service answers it,
  - the psycopg fetch of the rows the plan reads (its peer),
  - a periodic sweep in which 1 % of the runs are due,
  - a registration-triggered prune: a rolling checkpoint added to an active run, then
    `run_sweep(run_id=...)` (ledger writes included), checked to plan exactly the delete of
    the run's oldest rolling checkpoint: p50 / p95 / p99 / max, and
  - the first evaluation of an ended run (about 95 actions written): p50 / p95 / max.

    .venv/bin/python bench/sweep.py            # or: make bench-sweep

Plans of the whole catalog are split across processes as the service splits them
(CKPT_PLAN_PROCESSES, `--plan-processes`; 1 for one process alone), its helpers started
and ready before the first is timed, as a service starting on a large catalog has them.

Catalog shape per run: 80% of runs are active (3 rolling + 97 milestones), 20% ended
40 days ago (3 rolling + 96 milestones + 1 final), so the plan has real work: thinning,
cooling and archiving the ended runs, nothing for the active ones but keeps.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.db.migrate import upgrade  # noqa: E402
from app.db.session import make_engine, make_session_factory  # noqa: E402
from app.domain.tier import Tier  # noqa: E402
from app.policy.loading import validate_policy  # noqa: E402
from app.services.catalog.due_runs import due_run_ids  # noqa: E402
from app.services.catalog.policies import store_policy  # noqa: E402
from app.services.lifecycle import plan_helpers  # noqa: E402
from app.services.lifecycle.planning import plan_catalog  # noqa: E402
from app.services.lifecycle.sweep import run_sweep  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.register import TieredServer  # noqa: E402

PG_HOST = os.environ.get("CKPT_BENCH_PG_HOST", "127.0.0.1")
ADMIN_DSN = f"host={PG_HOST} port=5432 user=postgres dbname=postgres"
PER_RUN = 100
SIZE = 10**12  # bytes of each checkpoint
JSON = {"Content-Type": "application/json"}
TIERS = [
    Tier(name=n, url=f"file:///srv/ckpt/{n}", rank=i)
    for i, n in enumerate(("hot", "warm", "cold", "archive"))
]


def copy_rows(
    conn: psycopg.Connection[Any], table: str, columns: list[str], rows: list[tuple[Any, ...]]
) -> None:
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def load_runs(
    conn: psycopg.Connection[Any], start: int, count: int, now: datetime, rng: random.Random
) -> list[str]:
    """Add `count` runs of PER_RUN active checkpoints each; returns their ids."""
    run_rows, ckpt_rows, loc_rows, ids = [], [], [], []
    for n in range(start, start + count):
        run_id = f"run_{n:08d}{uuid.uuid4().hex[:12]}"
        ended = n % 5 == 0
        started = now - timedelta(days=90 if ended else 30)
        run_rows.append(
            (
                run_id,
                1,
                f"run-{n}",
                "completed" if ended else "active",
                "{}",
                None,
                None,
                started,
                now - timedelta(days=40) if ended else None,
                PER_RUN,  # the run's totals, as registrations keep them
                PER_RUN * SIZE,
            )
        )
        ids.append(run_id)
        for k in range(PER_RUN):
            step = (k + 1) * 1000
            klass = "rolling" if k >= PER_RUN - 3 else "milestone"
            if ended and k == PER_RUN - 4:
                klass = "final"
            cid = f"ckpt_{n:08d}{k:04d}{uuid.uuid4().hex[:8]}"
            uri = f"file:///srv/ckpt/hot/bench/run-{n}/step-{step}"
            created = started + timedelta(hours=6 * k)
            metrics = json.dumps({"eval_loss": round(rng.uniform(1.5, 3.0), 4)})
            ckpt_rows.append(
                (
                    cid,
                    run_id,
                    step,
                    klass,
                    "active",
                    uri,
                    "hot",
                    SIZE,
                    metrics,
                    "{}",
                    False,
                    created,
                    created,
                    created,
                )
            )
            loc_rows.append((cid, "hot", uri, "primary"))
    copy_rows(
        conn,
        "runs",
        [
            "id",
            "project_id",
            "name",
            "status",
            "labels",
            "policy",
            "resumed_from",
            "started_at",
            "ended_at",
            "active_checkpoints",
            "active_bytes",
        ],
        run_rows,
    )
    copy_rows(
        conn,
        "checkpoints",
        [
            "id",
            "run_id",
            "step",
            "class",
            "state",
            "uri",
            "tier",
            "size_bytes",
            "metrics",
            "labels",
            "pinned",
            "created_at",
            "registered_at",
            "committed_at",
        ],
        ckpt_rows,
    )
    copy_rows(conn, "locations", ["checkpoint_id", "tier", "uri", "role"], loc_rows)
    return ids


def http_plan(
    db: str, planned: int, kept: int, processes: int, asks: int
) -> tuple[list[float], int]:
    """`POST /v1/plan` of the whole catalog through `ckpt api`, as `ckpt plan` asks it, `asks`
    times of one server: each from the request to the answer's last byte, and each answer
    must hold the in-process plan's actions and kept checkpoints. The first is the plan of
    a server just started (its pool's connections and its helpers' first part); the later
    ones are what a long-lived service answers. Returns (seconds of each, bytes of the
    answer)."""
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-plan-") as tmp:
        work = Path(tmp)
        tiers = [{"name": t.name, "url": f"file://{work / t.name}"} for t in TIERS]
        server = TieredServer(
            db, work, tiers, work / "server.log", env={"CKPT_PLAN_PROCESSES": str(processes)}
        )
        try:
            server.wait_healthy()
            for _ in range(asks):
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
                t0 = time.perf_counter()
                conn.request("POST", "/v1/plan", body=b"{}", headers=JSON)
                response = conn.getresponse()
                body = response.read()
                took.append(time.perf_counter() - t0)
                conn.close()
                assert response.status == 200, (
                    f"POST /v1/plan answered {response.status}: {body[:500]!r}"
                )
                answer = json.loads(body)
                got = (len(answer["actions"]), len(answer["kept"]))
                assert got == (planned, kept), (
                    f"POST /v1/plan: {got}, the plan in process {planned, kept}"
                )
                del answer
                gc.collect()
        finally:
            server.stop()
    return took, len(body)


def fetch_plan_rows(conn: psycopg.Connection[Any]) -> float:
    """The peer of a full plan: psycopg fetching the rows the plan reads, nothing else."""
    gc.disable()  # as the plan does: a million rows, no cycles
    t0 = time.perf_counter()
    rows = (
        conn.cursor(binary=True)
        .execute(
            "SELECT c.id, c.run_id, c.step, c.class, c.size_bytes, c.created_at, c.pinned, "
            "c.tier, c.protected_until, CAST(c.metrics ->> 'eval_loss' AS FLOAT) "
            "FROM checkpoints c WHERE c.state = 'active'"
        )
        .fetchall()
    )
    took = time.perf_counter() - t0
    gc.enable()
    assert rows, "the catalog is empty"
    return took


def incremental_sweep(
    conn: psycopg.Connection[Any],
    factory: Any,
    run_ids: list[str],
    now: datetime,
    rng: random.Random,
) -> tuple[float, list[str]]:
    """A periodic sweep in which 1 % of the runs are due: every run evaluated and not due
    again for a day, then 1 % marked (as a finished action marks its run); times the sweep
    and checks it evaluated exactly those (none is due afterwards)."""
    conn.execute("UPDATE runs SET next_due_at = %s", (now + timedelta(days=1),))
    due = rng.sample(run_ids, max(1, len(run_ids) // 100))
    conn.execute("UPDATE runs SET next_due_at = %s WHERE id = ANY(%s)", (now, due))
    conn.commit()
    with factory() as session:
        assert sorted(due_run_ids(session, now)) == sorted(due)
    t0 = time.perf_counter()
    run_sweep(factory, tiers=TIERS, now=now, trigger="schedule", due_only=True)
    took = time.perf_counter() - t0
    with factory() as session:
        left = due_run_ids(session, now)
    assert left == [], f"{len(left)} runs still due after the sweep"
    return took, due


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 1),
    }


def registration_prunes(
    conn: psycopg.Connection[Any],
    factory: Any,
    run_ids: list[str],
    now: datetime,
    rng: random.Random,
    samples: int,
) -> tuple[list[float], float, list[str]]:
    """What a registration asks of the scheduler: a fourth rolling checkpoint lands in an
    active run (3 kept by `rolling-keep-3`), and the run's evaluation must delete the oldest
    one. Times `run_sweep(run_id=...)` in ms; checks each planned exactly that delete.

    The first prune is timed apart (returned second) and left out of the samples: it is
    the process's first evaluation of a single run, and builds and prepares that path's
    statements (21-55 ms here), once in a service's life. The samples are what every
    later registration costs."""
    active = [r for r in run_ids if int(r[4:12]) % 5 != 0]  # load_runs: every fifth ended
    took: list[float] = []
    chosen = rng.sample(active, min(samples + 1, len(active)))
    for n, run_id in enumerate(chosen):
        oldest = conn.execute(
            "SELECT id FROM checkpoints WHERE run_id = %s AND class = 'rolling' "
            "AND state = 'active' ORDER BY step LIMIT 1",
            (run_id,),
        ).fetchone()
        assert oldest is not None
        cid = f"ckpt_prune{n:06d}{uuid.uuid4().hex[:8]}"
        created = now - timedelta(minutes=5)
        conn.execute(
            "INSERT INTO checkpoints (id, run_id, step, class, state, uri, tier, size_bytes, "
            "metrics, labels, pinned, created_at, registered_at, committed_at) VALUES "
            "(%s, %s, 10000000, 'rolling', 'active', %s, 'hot', %s, '{}', '{}', false, %s, %s, "
            "%s)",
            (cid, run_id, f"file:///srv/ckpt/hot/bench/{cid}", 10**12, created, created, created),
        )
        conn.execute(
            "INSERT INTO locations (checkpoint_id, tier, uri, role) VALUES (%s, 'hot', %s, "
            "'primary')",
            (cid, f"file:///srv/ckpt/hot/bench/{cid}"),
        )
        conn.execute(
            "UPDATE runs SET active_checkpoints = active_checkpoints + 1, "
            "active_bytes = active_bytes + %s WHERE id = %s",
            (10**12, run_id),
        )
        conn.commit()
        t0 = time.perf_counter()
        _, created_ids = run_sweep(
            factory, tiers=TIERS, now=now, trigger="registration", run_id=run_id
        )
        took.append((time.perf_counter() - t0) * 1000)
        planned = conn.execute(
            "SELECT checkpoint_id, kind, state FROM actions WHERE id = ANY(%s)", (created_ids,)
        ).fetchall()
        assert planned == [(oldest[0], "delete", "pending")], f"{run_id}: planned {planned}"
    return took[1:], took[0], chosen


def first_evaluations(
    factory: Any, run_ids: list[str], now: datetime, rng: random.Random, samples: int
) -> tuple[list[float], list[str]]:
    """The first evaluation of an ended run never evaluated before: thinning, cooling and
    archiving planned at once (about 95 actions written). Times in ms; checks it wrote them."""
    ended = [r for r in run_ids if int(r[4:12]) % 5 == 0]
    took: list[float] = []
    chosen = rng.sample(ended, min(samples, len(ended)))
    for run_id in chosen:
        t0 = time.perf_counter()
        _, created = run_sweep(factory, tiers=TIERS, now=now, trigger="registration", run_id=run_id)
        took.append((time.perf_counter() - t0) * 1000)
        assert len(created) > 50, f"{run_id}: only {len(created)} actions planned"
    return took, chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="100000,300000,1000000",
        help="catalog sizes in active checkpoints, ascending",
    )
    parser.add_argument("--samples", type=int, default=50, help="single-run evaluations per size")
    parser.add_argument(
        "--plan-processes",
        type=int,
        default=Settings().plan_processes,
        help="processes a large plan is split across, as CKPT_PLAN_PROCESSES (the service's "
        "default: the cores, at most 4)",
    )
    parser.add_argument(
        "--warm-plans",
        type=int,
        default=2,
        help="POST /v1/plan asked again of the same server after the first (reported apart, "
        "as post_plan_http_warm_s, their median)",
    )
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    db = f"ckpt_bench_sweep_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    url = f"postgresql+psycopg://postgres@{PG_HOST}:5432/{db}"
    results: list[dict[str, Any]] = []
    try:
        upgrade(url)
        engine = make_engine(url)
        factory = make_session_factory(engine)
        policy = validate_policy(
            yaml.safe_load((ROOT / "policies/default.yaml").read_text()), [t.name for t in TIERS]
        )
        now = datetime.now(UTC)
        with factory() as session:
            store_policy(session, policy, source="bench", now=now)
            session.commit()
        # as the service does at start: the plan's helper processes, started and ready
        plan_helpers.configure(args.plan_processes)
        rng = random.Random(7)
        run_ids: list[str] = []
        used: set[str] = set()  # runs evaluated by a sweep or a sample already
        with psycopg.connect(f"host={PG_HOST} port=5432 user=postgres dbname={db}") as conn:
            conn.execute("INSERT INTO projects (name, created_at) VALUES ('bench', now())")
            conn.commit()
            for size in sizes:
                target_runs = size // PER_RUN
                t0 = time.perf_counter()
                run_ids += load_runs(conn, len(run_ids), target_runs - len(run_ids), now, rng)
                conn.commit()
                conn.execute("ANALYZE")
                conn.commit()
                load_s = time.perf_counter() - t0
                with factory() as session:
                    helpers = plan_helpers.warm(session, wait=60)
                with factory() as session:
                    t0 = time.perf_counter()
                    plan = plan_catalog(session, tiers=TIERS, now=now)
                    plan_s = time.perf_counter() - t0
                planned, kept = len(plan.items), len(plan.kept)
                assert planned and kept, "the full plan found nothing to do"
                del plan  # a million objects held would make every later collection slow
                gc.collect()
                with factory() as session:  # what a sweep after a policy edit plans
                    t0 = time.perf_counter()
                    # as run_sweep asks it: with each run's next due time and the shadows
                    replan = plan_catalog(
                        session, tiers=TIERS, now=now, explain=False, due=True, shadows=True
                    )
                    replan_s = time.perf_counter() - t0
                assert len(replan.items) == planned, "a sweep's plan differs from the dry run's"
                del replan
                gc.collect()
                asked, http_bytes = http_plan(
                    db, planned, kept, args.plan_processes, 1 + args.warm_plans
                )
                http_s = asked[0]
                warm_s = statistics.median(asked[1:]) if asked[1:] else None
                fetch_s = fetch_plan_rows(conn)
                incremental_s, due = incremental_sweep(conn, factory, run_ids, now, rng)
                used.update(due)
                fresh = sorted(set(run_ids) - used)  # not evaluated yet
                prune, first_prune, pruned = registration_prunes(
                    conn, factory, fresh, now, rng, args.samples
                )
                first, firsts = first_evaluations(factory, fresh, now, rng, args.samples)
                used.update(pruned, firsts)
                row = {
                    "checkpoints": size,
                    "runs": len(run_ids),
                    "load_s": round(load_s, 1),
                    "plan_processes": 1 + helpers,
                    "full_plan_s": round(plan_s, 2),
                    "psycopg_fetch_s": round(fetch_s, 2),
                    "full_plan_over_fetch": round(plan_s / fetch_s, 2),
                    "post_plan_http_s": round(http_s, 2),
                    "post_plan_http_mb": round(http_bytes / 1e6, 1),
                    "post_plan_http_over_fetch": round(http_s / fetch_s, 2),
                    "post_plan_http_warm_s": None if warm_s is None else round(warm_s, 2),
                    "post_plan_http_warm_over_fetch": (
                        None if warm_s is None else round(warm_s / fetch_s, 2)
                    ),
                    "post_plan_http_each_s": [round(t, 2) for t in asked],
                    "full_replan_s": round(replan_s, 2),
                    "full_replan_over_fetch": round(replan_s / fetch_s, 2),
                    "incremental_sweep_s": round(incremental_s, 3),
                    "incremental_due_runs": len(due),
                    "planned_actions": planned,
                    "kept": kept,
                    **{f"prune_{k}_ms": v for k, v in percentiles(prune).items()},
                    "prune_first_ms": round(first_prune, 1),
                    **{f"ended_run_first_{k}_ms": v for k, v in percentiles(first).items()},
                }
                results.append(row)
                print(json.dumps(row), flush=True)
        engine.dispose()
    finally:
        plan_helpers.shutdown()
        if not args.keep_db:
            with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    out = ROOT / "bench" / "results" / f"sweep-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(exist_ok=True)
    machine = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }
    out.write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
