"""The `ckpt` command as an operator runs it: a real process, real environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect

from app.db.models import Base
from app.db.session import make_engine
from tests.storage.ports import free_port, owns_port

CKPT = Path(sys.executable).parent / "ckpt"
START_TIMEOUT = 30.0


def ckpt_env(**variables: str) -> dict[str, str]:
    """The current environment without any CKPT_* setting, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")}
    env.update(variables)
    return env


def run_ckpt(
    *args: str, cwd: Path, timeout: float = 60.0, **variables: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CKPT), *args],
        cwd=cwd,
        env=ckpt_env(**variables),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def app_tables(url: str) -> set[str]:
    engine = make_engine(url, pool_size=1)
    try:
        return set(inspect(engine).get_table_names()) & set(Base.metadata.tables)
    finally:
        engine.dispose()


# --- configuration errors stop start-up ----------------------------------------------------


def test_serve_refuses_bad_duration(tmp_path: Path) -> None:
    result = run_ckpt("serve", cwd=tmp_path, CKPT_SWEEP_INTERVAL="soon")
    assert result.returncode != 0
    assert "CKPT_SWEEP_INTERVAL" in result.stderr
    assert "soon" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "var" / "ckpt.db").exists()


def test_serve_refuses_bad_port(tmp_path: Path) -> None:
    result = run_ckpt("serve", cwd=tmp_path, CKPT_PORT="abc")
    assert result.returncode != 0
    assert "CKPT_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_bad_tiers_file(tmp_path: Path) -> None:
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(
        f"tiers:\n  - name: hot\n    url: file://{tmp_path}/hot\n    colour: red\n"
    )
    result = run_ckpt("serve", cwd=tmp_path, CKPT_TIERS_FILE=str(tiers_file))
    assert result.returncode != 0
    assert str(tiers_file) in result.stderr
    assert "tiers[0].colour" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "var" / "ckpt.db").exists()


def test_serve_refuses_missing_tiers_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = run_ckpt("serve", cwd=tmp_path, CKPT_TIERS_FILE=str(missing))
    assert result.returncode != 0
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_auth_off_on_all_interfaces(tmp_path: Path) -> None:
    result = run_ckpt("serve", cwd=tmp_path, CKPT_AUTH="off", CKPT_HOST="0.0.0.0")
    assert result.returncode != 0
    assert "CKPT_AUTH" in result.stderr
    assert "0.0.0.0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "var" / "ckpt.db").exists()


def test_migrate_refuses_bad_configuration_too(tmp_path: Path) -> None:
    result = run_ckpt("migrate", cwd=tmp_path, CKPT_TRASH_RETENTION="a week")
    assert result.returncode != 0
    assert "CKPT_TRASH_RETENTION" in result.stderr


# --- migrate -------------------------------------------------------------------------------


def test_migrate_creates_the_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'ckpt.db'}"
    result = run_ckpt("migrate", cwd=tmp_path, CKPT_DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert app_tables(url) == set(Base.metadata.tables)
    again = run_ckpt("migrate", cwd=tmp_path, CKPT_DATABASE_URL=url)
    assert again.returncode == 0, again.stderr


def test_migrate_uses_the_documented_default_database(tmp_path: Path) -> None:
    result = run_ckpt("migrate", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    database = tmp_path / "var" / "ckpt.db"
    assert database.is_file()
    assert app_tables(f"sqlite:///{database}") == set(Base.metadata.tables)


# --- serve ---------------------------------------------------------------------------------

BOOTSTRAP_TOKEN = "bootstrap-secret-0123456789"


class Served:
    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr: Path) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.stderr = stderr

    def stop(self) -> str:
        """Stop the server (if still running) and return everything it wrote to stderr."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        return self.stderr.read_text()


def wait_until_healthy(served: Served) -> httpx.Response:
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(base_url=served.base_url, timeout=2.0) as client:
        while True:
            if served.process.poll() is not None:
                pytest.fail(
                    f"ckpt serve exited with {served.process.returncode}:\n"
                    f"{served.stderr.read_text()}"
                )
            try:
                if owns_port(served.process.pid, served.port):
                    return client.get("/healthz")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ckpt serve not ready after {START_TIMEOUT}s")
            time.sleep(0.05)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    stderr = tmp_path / "serve.stderr"
    with stderr.open("wb") as sink:
        process = subprocess.Popen(
            [str(CKPT), "serve"],
            cwd=work,
            env=ckpt_env(
                CKPT_DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'ckpt.db'}",
                CKPT_DATA_DIR=str(tmp_path / "data"),
                CKPT_AUTH="off",
                CKPT_PORT=str(port),
                CKPT_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN,
            ),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    server = Served(process, port, stderr)
    try:
        yield server
    finally:
        server.stop()


def test_serve_answers_healthz(served: Served, tmp_path: Path) -> None:
    response = wait_until_healthy(served)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    tiers = httpx.get(f"{served.base_url}/v1/tiers", timeout=5.0)
    assert tiers.status_code == 200, tiers.text
    assert [t["name"] for t in tiers.json()["items"]] == ["hot", "warm", "cold", "archive"]
    for name in ("hot", "warm", "cold", "archive"):
        assert (tmp_path / "data" / name).is_dir()
    assert app_tables(f"sqlite:///{tmp_path / 'db' / 'ckpt.db'}") == set(Base.metadata.tables)


def test_serve_writes_only_structured_logs(served: Served) -> None:
    assert wait_until_healthy(served).status_code == 200
    assert httpx.get(f"{served.base_url}/v1/nothing-here", timeout=5.0).status_code == 404
    output = served.stop()
    # uvicorn shuts down cleanly, then re-raises SIGTERM so the exit status shows the signal
    assert served.process.returncode in (0, -signal.SIGTERM)
    lines = output.splitlines()
    assert lines, "ckpt serve wrote no logs"
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON log line: {line!r}")
        assert isinstance(entry, dict), line
        assert {"ts", "level", "msg"} <= entry.keys(), line
        assert entry["level"] in {"debug", "info", "warning", "error", "critical"}, line
        assert not any("\x1b" in str(value) for value in entry.values()), line
        entries.append(entry)
    assert any("shutdown complete" in e["msg"].lower() for e in entries), "no clean shutdown"
    starting = [e for e in entries if e["msg"] == "starting"]
    assert starting, "no start-up log entry"
    assert starting[0]["auth"] == "off"
    assert BOOTSTRAP_TOKEN not in output
