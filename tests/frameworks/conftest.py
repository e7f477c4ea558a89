"""The training frameworks against a real service: `ckpt serve` (API, worker and scheduler)
on PostgreSQL, and training scripts run as processes of their own with the frameworks'
Python (tests/frameworks/env.sh builds it once per machine, outside the clone), so a test
can SIGKILL a training mid-save the way a preempted job dies.

The training process imports `ckpt_client` from this checkout (client/src on its path):
the environment holds only the frameworks, so it is reused whatever the client's code.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from app.db.session import make_engine, make_session_factory, session_scope
from app.services.catalog.reservations import abort_abandoned
from tests.client.conftest import ADMIN, Service, serve
from tests.conftest import migrated_database

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV_SCRIPT = HERE / "env.sh"
CLIENT_SRC = REPO / "client" / "src"
TRAIN_TIMEOUT = 300.0


@pytest.fixture(scope="session")
def frameworks_python() -> Path:
    """The frameworks' Python: `CKPT_FRAMEWORKS_PYTHON`, else the one env.sh builds (or
    finds built). Never skipped: without it the integrations are untested."""
    given = os.environ.get("CKPT_FRAMEWORKS_PYTHON")
    if given:
        return Path(given)
    built = subprocess.run(
        ["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False
    )
    if built.returncode != 0:
        pytest.fail(f"the frameworks' test environment could not be built:\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def catalog_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL database of the module's own, at the latest schema (the integrations
    do not depend on the database; the production one is the one tested)."""
    yield from migrated_database("postgresql", tmp_path_factory)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, catalog_url: str) -> Iterator[Service]:
    """`ckpt serve` on the module's database, access control on (the admin token is
    `ADMIN`), with no trash period: what a policy deletes is purged as soon as the worker
    gets to it, so a test sees the files a policy keeps and nothing else."""
    yield from serve(tmp_path_factory.mktemp("service"), catalog_url, CKPT_TRASH_RETENTION="0s")


def abandon_due(catalog_url: str, now: datetime) -> list[str]:
    """What the scheduler's abandonment check does at `now` (it runs every 30 s): abort
    the reservations whose `reserved_until` has passed; returns their ids. A test of a
    killed save calls it with a clock past the reservation instead of waiting."""
    engine = make_engine(catalog_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            return abort_abandoned(session, now=now)
    finally:
        engine.dispose()


@pytest.fixture
def project() -> str:
    """A project of the test's own."""
    return f"p-{uuid.uuid4().hex[:12]}"


@dataclass
class Training:
    """A training script run with the frameworks' Python against the service."""

    python: Path
    service: Service
    spool_dir: Path

    def env(self, **variables: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")}
        env.update(
            CKPT_URL=self.service.url,
            CKPT_TOKEN=ADMIN,
            CKPT_SPOOL_DIR=str(self.spool_dir),
            PYTHONPATH=os.pathsep.join([str(CLIENT_SRC), str(REPO)]),
            # the CPU only, and few threads: two cores are shared with the service
            CUDA_VISIBLE_DEVICES="",
            OMP_NUM_THREADS="1",
            JAX_PLATFORMS="cpu",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            **variables,
        )
        return env

    def start(self, script: Path, *args: str, **variables: str) -> subprocess.Popen[str]:
        """Start `script` (a path) with `args`; the caller waits for or kills it."""
        return subprocess.Popen(
            [str(self.python), str(script), *args],
            env=self.env(**variables),
            cwd=self.spool_dir.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, script: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
        """Run `script` to its end; fails the test with its output if it fails."""
        done = subprocess.run(
            [str(self.python), str(script), *args],
            env=self.env(**variables),
            cwd=self.spool_dir.parent,
            capture_output=True,
            text=True,
            timeout=TRAIN_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(
                f"{script.name} {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
            )
        return done


@pytest.fixture
def training(frameworks_python: Path, service: Service, tmp_path: Path) -> Training:
    return Training(frameworks_python, service, tmp_path / "spool")
