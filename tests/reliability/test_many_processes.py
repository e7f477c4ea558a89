"""Two `ckpt scheduler` and four `ckpt worker` processes on one PostgreSQL (DESIGN section 8,
invariant 4): every planned move is written to the ledger once and executed once, none is
lost, nobody deadlocks, and the two schedulers' sweeps never run at the same time.

The catalog: RUNS completed runs of 10 milestones each on `hot`, under a policy that moves
every milestone of an ended run to `cold`, so each checkpoint gets exactly one action and
every execution is observable: the file appears on `cold` and leaves `hot`. `make test` runs
200 runs (2,000 actions); `CKPT_TEST_CONCURRENCY_RUNS` changes that (`make soak`: 50,000).

Both schedulers are made to sweep at the same moment: the test holds the sweep's advisory
lock until PostgreSQL shows both waiting for it, then lets go. Concurrent identical
registrations (32 clients, one checkpoint) are proven by
tests/integration/test_concurrency.py::test_identical_registrations_leave_one_checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, func, insert, select

from app.db.migrate import upgrade
from app.db.models import Action, Checkpoint, Location, Project, Run, Sweep
from app.db.session import make_engine, make_session_factory, session_scope
from app.domain.ids import new_id
from app.services.lifecycle.sweep import SWEEP_LOCK_KEY
from tests.conftest import create_pg_database, drop_pg_database, postgres_url
from tests.figures import FIGURES

CKPT = Path(sys.executable).parent / "ckpt"
RUNS = int(os.environ.get("CKPT_TEST_CONCURRENCY_RUNS", "200"))
STEPS = 10
SCHEDULERS = 2
WORKERS = 4
POLICY = """\
name: default
rules:
  - name: milestones-cold
    class: milestone
    when: {run_ended: 0s}
    action: {move_to: cold}
"""
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05


def content(run: int, step: int) -> bytes:
    return f"run {run} step {step}\n".encode() * 4


@dataclass
class Catalog:
    engine: Engine
    url: str
    data_dir: Path
    checkpoints: dict[str, tuple[int, int]]  # id -> (run, step)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    """A database of its own with RUNS x STEPS milestones of completed runs, files on hot."""
    name = create_pg_database()
    url = postgres_url(name)
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        # Commits wait for no disk flush: concurrency is under test here, not durability,
        # and otherwise each of the workers' ~7 commits per move waits for an fsync.
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    engine = make_engine(url, pool_size=4)
    try:
        upgrade(url)
        data_dir = tmp_path / "data"
        yield Catalog(engine, url, data_dir, populate(engine, data_dir))
    finally:
        engine.dispose()
        drop_pg_database(name)


def populate(engine: Engine, data_dir: Path) -> dict[str, tuple[int, int]]:
    now = datetime.now(UTC)
    hot = (data_dir / "hot").resolve()
    checkpoints: dict[str, tuple[int, int]] = {}
    runs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    locations: list[dict[str, Any]] = []
    with session_scope(make_session_factory(engine)) as session:
        project_id = session.execute(
            insert(Project).values(name="soak", created_at=now).returning(Project.id)
        ).scalar_one()
        for r in range(RUNS):
            run_id = new_id("run")
            size = len(content(r, 0))
            runs.append(
                {
                    "id": run_id,
                    "project_id": project_id,
                    "name": f"run-{r:05d}",
                    "status": "completed",
                    "labels": {},
                    "started_at": now - timedelta(days=2),
                    "ended_at": now - timedelta(days=1),
                    "active_checkpoints": STEPS,
                    "active_bytes": STEPS * size,
                }
            )
            for step in range(1, STEPS + 1):
                data = content(r, step)
                root = hot / "soak" / f"run-{r:05d}" / f"step-{step}"
                root.mkdir(parents=True)
                (root / "w.bin").write_bytes(data)
                checkpoint_id = new_id("ckpt")
                checkpoints[checkpoint_id] = (r, step)
                rows.append(
                    {
                        "id": checkpoint_id,
                        "run_id": run_id,
                        "step": step,
                        "klass": "milestone",
                        "state": "active",
                        "uri": f"file://{root}",
                        "tier": "hot",
                        "size_bytes": len(data),
                        "files": [
                            {
                                "path": "w.bin",
                                "size_bytes": len(data),
                                "sha256": hashlib.sha256(data).hexdigest(),
                            }
                        ],
                        "created_at": now - timedelta(days=1, hours=1),
                        "registered_at": now,
                        "committed_at": now,
                    }
                )
                locations.append(
                    {"checkpoint_id": checkpoint_id, "tier": "hot", "uri": f"file://{root}"}
                )
        session.execute(insert(Run), runs)
        session.execute(insert(Checkpoint), rows)
        session.execute(insert(Location), [{**loc, "role": "primary"} for loc in locations])
    return checkpoints


# --- the processes ---------------------------------------------------------------------------


@dataclass
class Fleet:
    """The scheduler and worker processes, each logging JSON lines to its own file."""

    root: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, command: str) -> None:
        with open(self.root / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [str(CKPT), command], env=self.env, cwd=self.root, stdout=log, stderr=log
            )

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}

    def stop(self) -> dict[str, int | None]:
        """SIGTERM to all, then wait; the exit codes (None: still running, then killed)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        codes: dict[str, int | None] = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
                process.kill()
                process.wait()
        return codes

    def log_lines(self, prefix: str) -> list[dict[str, Any]]:
        lines = []
        for path in sorted(self.root.glob(f"{prefix}*.log")):
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = {"level": "raw", "msg": line, "process": path.stem}
                if isinstance(entry, dict):
                    lines.append({**entry, "process": path.stem})
        return lines


@pytest.fixture
def fleet(tmp_path: Path, catalog: Catalog) -> Iterator[Fleet]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text(POLICY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    env.update(
        CKPT_DATABASE_URL=catalog.url,
        CKPT_DATA_DIR=str(catalog.data_dir),
        CKPT_POLICIES_DIR=str(policies),
        CKPT_SWEEP_INTERVAL="2s",
        CKPT_AUTH="off",
    )
    running = Fleet(tmp_path, env)
    try:
        yield running
    finally:
        running.stop()


def wait_for(what: str, condition: Callable[[], bool], timeout: float, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert not fleet.dead(), f"processes exited while waiting for {what}: {fleet.dead()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(POLL_S)


# --- watching the sweep lock -----------------------------------------------------------------

LOCK_SQL = """
SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted)
FROM pg_locks
WHERE locktype = 'advisory' AND classid::bigint = %(high)s AND objid::bigint = %(low)s
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
LOCK_KEY = {"high": SWEEP_LOCK_KEY >> 32, "low": SWEEP_LOCK_KEY & 0xFFFFFFFF}


class LockWatch:
    """Samples who holds and who waits for the sweep lock, until stopped."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.samples = 0
        self.most_holders = 0
        self.most_waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(0.02):
                row = conn.execute(LOCK_SQL, LOCK_KEY).fetchone()
                assert row is not None
                self.samples += 1
                self.most_holders = max(self.most_holders, row[0])
                self.most_waiting = max(self.most_waiting, row[1])


def waiting_for_sweep_lock(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(LOCK_SQL, LOCK_KEY).fetchone()
    assert row is not None
    return int(row[1])


# --- the test ---------------------------------------------------------------------------------


def count(engine: Engine, stmt: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def test_two_schedulers_and_four_workers_execute_every_action_exactly_once(
    catalog: Catalog, fleet: Fleet, record_property: Callable[[str, object], None]
) -> None:
    engine, total = catalog.engine, len(catalog.checkpoints)
    dsn = catalog.url.replace("postgresql+psycopg://", "postgresql://")
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as holder, LockWatch(dsn) as watch:
        # Both schedulers sweep first at the same moment: the lock is ours until both wait.
        holder.execute("SELECT pg_advisory_lock(%s)", (SWEEP_LOCK_KEY,))
        for n in range(SCHEDULERS):
            fleet.start(f"scheduler-{n}", "scheduler")
        for n in range(WORKERS):
            fleet.start(f"worker-{n}", "worker")
        wait_for(
            "two schedulers waiting for the sweep lock",
            lambda: waiting_for_sweep_lock(holder) == SCHEDULERS,
            START_TIMEOUT_S,
            fleet,
        )
        holder.execute("SELECT pg_advisory_unlock(%s)", (SWEEP_LOCK_KEY,))
        written = select(func.count()).select_from(Action)
        wait_for("the sweep's actions", lambda: count(engine, written) > 0, 60, fleet)
        still_open = written.where(Action.state.in_(("held", "pending", "running")))
        wait_for(
            "every action over", lambda: count(engine, still_open) == 0, 120 + total / 2, fleet
        )
        # A few more sweeps by both schedulers, which must find nothing left to do.
        sweeps_before = count(engine, select(func.count()).select_from(Sweep))
        wait_for(
            "two more sweeps of each scheduler",
            lambda: (
                count(engine, select(func.count()).select_from(Sweep))
                >= sweeps_before + 2 * SCHEDULERS
            ),
            60,
            fleet,
        )
        codes = fleet.stop()
    elapsed = time.monotonic() - started

    assert codes == dict.fromkeys(fleet.processes, 0), codes
    with engine.connect() as conn:
        actions = conn.execute(
            select(
                Action.id,
                Action.checkpoint_id,
                Action.kind,
                Action.to_tier,
                Action.state,
                Action.attempts,
                Action.step,
                Action.dest_uri,
                Action.sweep_id,
            )
        ).all()
        sweeps = conn.execute(select(Sweep.id, Sweep.actions)).all()
        locations = conn.execute(
            select(Location.checkpoint_id, Location.tier, Location.role, Location.uri)
        ).all()
        states = Counter(conn.execute(select(Checkpoint.state)).scalars())
    by_checkpoint: dict[str, list[Any]] = defaultdict(list)
    for action in actions:
        by_checkpoint[action.checkpoint_id].append(action)

    # the ledger: no checkpoint lost its move; every action done, each claimed exactly once
    assert set(by_checkpoint) == set(catalog.checkpoints)
    outcomes = Counter((a.kind, a.to_tier, a.state) for a in actions)
    assert outcomes == {("move", "cold", "done"): len(actions)}
    assert Counter(a.attempts for a in actions) == {1: len(actions)}
    # one sweep planned every move; each sweep wrote the actions it says it wrote
    assert any(s.actions == total for s in sweeps)
    assert {s.id: s.actions for s in sweeps if s.actions} == dict(
        Counter(a.sweep_id for a in actions)
    )
    # executed once: one action per checkpoint copied and switched it; any other closed
    # without touching storage (nothing recorded: it found the checkpoint already there)
    for checkpoint_id, moves in by_checkpoint.items():
        movers = [a for a in moves if a.dest_uri is not None]
        assert [a.step for a in movers] == ["switched"], (checkpoint_id, moves)
        assert all(a.step is None for a in moves if a.dest_uri is None), (checkpoint_id, moves)
    # the workers: each action finished exactly once
    finished = Counter(
        line["action_id"] for line in fleet.log_lines("worker") if line["msg"] == "action finished"
    )
    assert finished == dict.fromkeys((a.id for a in actions), 1)
    # nobody failed, deadlocked or complained (APScheduler may warn that a sweep was skipped
    # while the previous one waited for the lock: that is the lock working)
    complaints = [
        line
        for line in fleet.log_lines("")
        if line.get("level") in ("error", "critical")
        or (line.get("level") == "warning" and str(line.get("logger", "")).startswith("app"))
        or "deadlock" in json.dumps(line).lower()
        or "Traceback" in str(line.get("msg"))
    ]
    assert complaints == []
    # storage: every file once on cold, nothing left on hot
    assert states == {"active": total}
    assert len(locations) == total
    cold = (catalog.data_dir / "cold").resolve()
    for checkpoint_id, tier, role, uri in locations:
        run, step = catalog.checkpoints[checkpoint_id]
        root = cold / "soak" / f"run-{run:05d}" / f"step-{step}"
        assert (tier, role, uri) == ("cold", "primary", f"file://{root}")
        assert (root / "w.bin").read_bytes() == content(run, step)
    assert sum(1 for p in cold.rglob("*") if p.is_file()) == total
    assert [p for p in (catalog.data_dir / "hot").rglob("*") if p.is_file()] == []
    # the sweeps never overlapped: PostgreSQL never granted their lock twice at once, and
    # both schedulers were waiting for it together at the start
    assert watch.samples > 0 and watch.most_holders <= 1
    twice = sum(1 for moves in by_checkpoint.values() if len(moves) > 1)
    assert twice == 0, f"{twice} of {total} checkpoints got a second move planned"
    record_property(
        FIGURES,
        f"concurrency: {total} checkpoints moved exactly once by {WORKERS} workers and "
        f"{SCHEDULERS} schedulers in {elapsed:.1f} s; {len(actions)} actions, "
        f"{len(sweeps)} sweeps; sweep lock sampled {watch.samples} times, "
        f"at most {watch.most_waiting} waiting",
    )
