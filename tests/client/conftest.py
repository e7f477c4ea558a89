"""The client against the real service: `ckpt serve` (API, worker and scheduler in one
process) on a free port, with access control on, on SQLite and on PostgreSQL.

Each module gets databases of its own (not the session's shared one, which other modules
empty and fill with policies of their own) and one service per database; each test works
in a project of its own, so the tests of a module never see each other's runs.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ckpt_client import Client
from tests.builders import remember_secret
from tests.conftest import migrated_database
from tests.storage.ports import free_port, owns_port

CKPT = Path(sys.executable).parent / "ckpt"
START_TIMEOUT = 60.0
ADMIN = remember_secret(f"client-tests-admin-{uuid.uuid4().hex}")


def ckpt_env(**variables: str) -> dict[str, str]:
    """The current environment without any CKPT_* setting, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")}
    env.update(variables)
    return env


class Service:
    """One `ckpt serve` process that can be stopped and started again on the same port and
    database (an outage, as a training job sees one)."""

    def __init__(self, root: Path, database_url: str, **variables: str) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = root / "data"
        policies = root / "policies"
        policies.mkdir(parents=True, exist_ok=True)
        self.stderr = root / "serve.stderr"
        self.env = ckpt_env(
            CKPT_DATABASE_URL=database_url,
            CKPT_DATA_DIR=str(self.data_dir),
            CKPT_POLICIES_DIR=str(policies),
            CKPT_AUTH="on",
            CKPT_BOOTSTRAP_TOKEN=ADMIN,
            CKPT_PORT=str(self.port),
            **variables,
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.stderr.open("ab") as sink:
            self.process = subprocess.Popen(
                [str(CKPT), "serve"],
                cwd=self.root,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
        deadline = time.monotonic() + START_TIMEOUT
        with httpx.Client(base_url=self.url, timeout=2.0) as probe:
            while True:
                if self.process.poll() is not None:
                    pytest.fail(f"ckpt serve exited: {self.stderr.read_text()[-3000:]}")
                try:
                    mine = owns_port(self.process.pid, self.port)
                    if mine and probe.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"ckpt serve not ready after {START_TIMEOUT}s")
                time.sleep(0.05)

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
        # stopped: its port refuses connections now, as in an outage
        assert not owns_port(process.pid, self.port)

    def logs(self) -> str:
        return self.stderr.read_text() if self.stderr.exists() else ""

    def admin(self) -> httpx.Client:
        """A plain HTTP client with the admin token: what the tests check the catalog with."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30.0
        )

    def tier_dir(self, tier: str) -> Path:
        return self.data_dir / tier


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def catalog_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database of the module's own, at the latest schema."""
    yield from migrated_database(request.param, tmp_path_factory)


def serve(root: Path, catalog_url: str, **variables: str) -> Iterator[Service]:
    service = Service(root, catalog_url, **variables)
    service.start()
    try:
        yield service
    finally:
        service.stop()
        assert ADMIN not in service.logs(), "the admin token is in the service's logs"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, catalog_url: str) -> Iterator[Service]:
    yield from serve(tmp_path_factory.mktemp("service"), catalog_url)


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def client(service: Service, spool_dir: Path) -> Iterator[Client]:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir, deadline=20.0) as catalog:
        yield catalog


@pytest.fixture
def project() -> str:
    """A project of the test's own."""
    return f"p-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session", autouse=True)
def client_logs_searched_too(no_secret_in_any_log: logging.Handler) -> Iterator[None]:
    """The client's log lines join the run's, searched at its end for every token."""
    logger = logging.getLogger("ckpt_client")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(no_secret_in_any_log)
    yield
    logger.removeHandler(no_secret_in_any_log)
    logger.setLevel(level)
