"""The shipped `ckpt worker --once`, killed by `CKPT_CRASH_AT` after it switched the catalog
to a verified copy and before it removed the source; the next `ckpt worker --once`, once the
dead worker's lease has expired, finishes the move and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import update

from app.db.migrate import upgrade
from app.db.models import Action
from app.db.session import make_engine, make_session_factory, session_scope
from app.services.lifecycle.crash import CRASH_AT_ENV, CRASH_TRACE_ENV
from tests.reliability.harness import (
    Scenario,
    after_crash,
    at_end,
    make_world,
    read_catalog,
    read_trace,
    seed,
)

CKPT = Path(sys.executable).parent / "ckpt"


def test_the_worker_command_dies_at_the_point_and_the_next_one_finishes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ckpt.db'}"
    upgrade(url)
    engine = make_engine(url, pool_size=2)
    factory = make_session_factory(engine)
    world = make_world(tmp_path / "world")
    seeded = seed(world, factory, Scenario("move", "hot", "cold"))
    (tmp_path / "policies").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    env.update(
        CKPT_DATABASE_URL=url,
        CKPT_DATA_DIR=str(world.data_dir),
        CKPT_TIERS_FILE=str(world.tiers_file),
        CKPT_POLICIES_DIR=str(tmp_path / "policies"),
        CKPT_AUTH="off",
    )
    trace = tmp_path / "trace"

    def worker(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CKPT), "worker", "--once"],
            env={**env, **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    crashed = worker(**{CRASH_AT_ENV: "transfer.switched", CRASH_TRACE_ENV: str(trace)})

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert read_trace(trace) == [
        "worker.claimed#1",
        "transfer.started#1",
        "transfer.uploads_aborted#1",
        "transfer.file_copied#1",
        "transfer.file_copied#2",
        "transfer.copied#1",
        "transfer.destination_checked#1",
        "transfer.verified#1",
        "transfer.switched#1",
    ]
    catalog = read_catalog(factory, seeded.checkpoint_id)
    assert after_crash(world, seeded, catalog) == []
    (_, _, state, step, attempts, _) = catalog.action(seeded.action_id)
    assert (state, step, attempts) == ("running", "switched", 1)
    copy = world.tiers["cold"].parsed.join(seeded.prefix)
    assert catalog.locations == [("cold", "primary", copy)]  # the source is not catalogued

    with session_scope(factory) as session:  # what an expired lease looks like
        session.execute(
            update(Action)
            .where(Action.id == seeded.action_id)
            .values(lease_until=datetime.now(UTC) - timedelta(seconds=1))
        )
    finished = worker()

    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "1 actions executed"
    catalog = read_catalog(factory, seeded.checkpoint_id)
    assert at_end(world, seeded, catalog) == []
    assert catalog.action(seeded.action_id)[4] == 2
    engine.dispose()
