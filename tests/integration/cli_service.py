"""A real catalog service for the `ckpt` command's tests: the app served by uvicorn on a
free port in a background thread, on the test database (SQLite and PostgreSQL), with
access control on and real tokens, and the command run against it with --url and --token,
either in this process (Typer's CliRunner, quick) or as a process of its own (a real
environment, terminal and working directory)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine, select
from typer.testing import CliRunner, Result

from app.cli import cli
from app.db.models import Action
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import bearer, issue_token, place_checkpoint

CKPT = Path(sys.executable).parent / "ckpt"
SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
START_TIMEOUT = 15.0


@dataclass
class Service:
    """The service under test and what a test needs to drive it and the command."""

    url: str
    app: FastAPI
    engine: Engine
    settings: Settings
    admin: str  # an admin token's secret
    admin_id: str  # and its id
    cwd: Path  # an empty directory the commands run in
    run: dict[str, Any] = field(default_factory=dict)
    ckpts: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def policies_dir(self) -> Path:
        return self.settings.policies_dir

    def http(self, token: str | None = None) -> httpx.Client:
        secret = self.admin if token is None else token
        return httpx.Client(base_url=self.url, headers=bearer(secret), timeout=30.0)

    def args(self, args: tuple[str, ...], token: str | None) -> list[str]:
        secret = self.admin if token is None else token
        return [*args, "--url", self.url, *(["--token", secret] if secret else [])]

    def invoke(self, *args: str, token: str | None = None, columns: int = 250) -> Result:
        """`ckpt ARGS --url URL --token TOKEN` in this process (the groups' own options
        come after the command, as a person types them)."""
        return CliRunner().invoke(
            cli,
            self.args(args, token),
            env={"COLUMNS": str(columns), "CKPT_URL": None, "CKPT_TOKEN": None},
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a command process: no CKPT_* of the caller's, wide tables."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")}
        env["COLUMNS"] = "250"
        env.update(extra)
        return env

    def ckpt(
        self, *args: str, token: str | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """`ckpt ARGS --url URL --token TOKEN` as a process of its own, in `cwd`."""
        return subprocess.run(
            [str(CKPT), *self.args(args, token)],
            cwd=self.cwd,
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def database_env(self, **extra: str) -> dict[str, str]:
        """The environment of a command that is the service (`ckpt worker`): its database,
        tiers and policies."""
        return self.env(
            CKPT_DATABASE_URL=self.settings.database_url,
            CKPT_DATA_DIR=str(self.data_dir),
            CKPT_POLICIES_DIR=str(self.policies_dir),
            CKPT_AUTH="off",
            **extra,
        )

    def serving(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """A command that opens the database (`worker --once`), as a process."""
        return subprocess.run(
            [str(CKPT), *args],
            cwd=self.cwd,
            env=self.database_env(**extra),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def actions(self) -> list[tuple[str, str, str, str]]:
        """(checkpoint id, kind, state, rule) of every ledger row, read from the database."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(Action.checkpoint_id, Action.kind, Action.state, Action.rule)
            ).all()
        return sorted((r[0], r[1], r[2], r[3]) for r in rows)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """`app` served over real HTTP in a background thread, on a port the OS picked."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        assert thread.is_alive(), "the server stopped while starting"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture
def service(settings: Settings, clean_engine: Engine, tmp_path: Path) -> Iterator[Service]:
    """The service with the shipped default policy and access control on, on an empty
    catalog; `service.admin` is an admin token."""
    settings.policies_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED_POLICY, settings.policies_dir / "default.yaml")
    on = settings.model_copy(update={"auth": "on"})
    app = create_app(on, engine=clean_engine, roles=NO_BACKGROUND)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with serve(app) as url:
        admin_id, admin = issue_token(app, name="ops", scopes=("admin",))
        yield Service(url, app, clean_engine, on, admin, admin_id, cwd)


@pytest.fixture
def catalog(service: Service) -> Service:
    """The service with one active run of five rolling checkpoints on hot: the shipped
    policy keeps the newest three and would delete steps 1 and 2."""
    with service.http() as client:
        made = client.post(
            "/v1/runs",
            json={"project": "llm", "name": "run-1", "started_at": "2020-01-01T00:00:00Z"},
        )
        assert made.status_code == 201, made.text
        service.run = made.json()
        service.ckpts = {
            step: place_checkpoint(client, service.data_dir, service.run, step)
            for step in range(1, 6)
        }
    return service
