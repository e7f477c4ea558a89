"""An outage, replayed by `python -m ckpt_client flush` once the service is back (same port,
same database), as an operator or a job's epilogue runs it: a real process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckpt_client import Client
from tests.client.conftest import ADMIN, Service, ckpt_env, serve
from tests.client.outage import (
    DEADLINE,
    assert_landed_once_in_order,
    figure,
    train_through_an_outage,
)
from tests.figures import FIGURES


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, catalog_url: str) -> Iterator[Service]:
    """The module's service, which its tests stop and start (one start costs seconds)."""
    yield from serve(tmp_path_factory.mktemp("service"), catalog_url)


@pytest.fixture(autouse=True)
def running(service: Service) -> None:
    """Each test finds the service up, whatever the test before it left."""
    if service.process is None or service.process.poll() is not None:
        service.start()


def flush(service: Service, spool_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_client", "flush", "--deadline", str(DEADLINE)],
        env=ckpt_env(CKPT_URL=service.url, CKPT_TOKEN=ADMIN, CKPT_SPOOL_DIR=str(spool_dir)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_flush_replays_the_outage_in_order(
    service: Service,
    spool_dir: Path,
    project: str,
    record_property: Callable[[str, object], None],
) -> None:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir, deadline=DEADLINE) as client:
        run, ended, durations = train_through_an_outage(service, client, project)
    record_property(FIGURES, figure(durations, "flush"))

    down = flush(service, spool_dir)
    assert down.returncode == 3, down
    assert "21 calls still spooled" in down.stderr
    service.start()

    result = flush(service, spool_dir)

    assert result.returncode == 0, result
    assert "21 of 21 spooled calls landed" in result.stdout
    assert ADMIN not in result.stdout + result.stderr + down.stdout + down.stderr
    assert_landed_once_in_order(service, run, ended)
    again = flush(service, spool_dir)
    assert again.returncode == 0 and "nothing spooled" in again.stdout
    assert_landed_once_in_order(service, run, ended)


def test_flush_exits_1_when_the_service_refuses_a_call(
    service: Service, spool_dir: Path, project: str
) -> None:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir, deadline=DEADLINE) as client:
        run = client.run(project, "run-1")
        client.spool.add(
            "register",
            "POST",
            f"/v1/runs/{run.id}/checkpoints",
            {"step": 1, "class": "rolling", "uri": "file:///nowhere/step-1"},
            "step 1 of a run",
        )

    result = flush(service, spool_dir)

    assert result.returncode == 1, result
    assert "0 of 1 spooled calls landed" in result.stdout
    assert "refused, kept in" in result.stderr and "422" in result.stderr
    assert [p.parent.name for p in (spool_dir / "failed").iterdir()] == ["failed"]
    assert flush(service, spool_dir).returncode == 0  # set aside: never retried
