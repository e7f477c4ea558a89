"""CKPT_METRICS_PORT: `ckpt worker` and `ckpt scheduler` serve their own counters there, for
the PodMonitor. Run for real: the worker serves them while it runs, still stops cleanly on
SIGTERM (a pod's shutdown); a port out of range stops it naming the variable."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.support import REPO
from tests.storage.ports import free_port

CKPT = Path(sys.executable).parent / "ckpt"
# What the dashboard and alerts read from workers and schedulers (the API has the rest).
WORKER_FAMILIES = {
    "ckpt_actions_finished",
    "ckpt_action_storage_retries",
    "ckpt_storage_retries",
    "ckpt_transfer_bytes",
    "ckpt_purged_bytes",
    "ckpt_sweep_duration_seconds",
    "ckpt_action_claim_lag_seconds",
    "ckpt_reconcile_findings",
}


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def migrated(database: Path) -> bool:
    try:
        with sqlite3.connect(database) as conn:
            return bool(conn.execute("SELECT version_num FROM alembic_version").fetchone())
    except sqlite3.Error:
        return False


def test_worker_serves_its_counters_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    database = tmp_path / "ckpt.db"
    env = {
        **os.environ,
        "CKPT_DATABASE_URL": f"sqlite:///{database}",
        "CKPT_DATA_DIR": str(tmp_path / "data"),
        "CKPT_POLICIES_DIR": str(REPO / "policies"),
        "CKPT_TIERS_FILE": "",
        "CKPT_METRICS_PORT": str(port),
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(CKPT), "worker"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        text = None
        while text is None or not migrated(database):
            assert process.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "no /metrics or no schema in 30 s"
            time.sleep(0.1)
            text = scrape(port)
        families = {family.name for family in text_string_to_metric_families(text)}
        assert not WORKER_FAMILIES - families, WORKER_FAMILIES - families

        time.sleep(1.5)  # past the migration: the worker loop and its signal handlers are up
        assert process.poll() is None, log.read_text()[-2000:]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=40) == 0, log.read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_bad_metrics_port_is_refused_naming_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "CKPT_METRICS_PORT": "70000", "CKPT_DATABASE_URL": "sqlite://"}
    result = subprocess.run(
        [str(CKPT), "worker", "--once"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "CKPT_METRICS_PORT" in result.stderr, result.stderr
