"""An outage, replayed by the job's own next call once the service is back (same port, same
database); and what a job sees of the spool around it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckpt_client import Client, Unavailable
from tests.client.conftest import ADMIN, Service, serve
from tests.client.helpers import write_step
from tests.client.outage import (
    DEADLINE,
    SLACK,
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


@pytest.fixture
def client(service: Service, spool_dir: Path) -> Iterator[Client]:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir, deadline=DEADLINE) as catalog:
        yield catalog


def test_the_next_call_replays_the_outage_in_order(
    service: Service,
    client: Client,
    project: str,
    record_property: Callable[[str, object], None],
) -> None:
    run, ended, durations = train_through_an_outage(service, client, project)
    record_property(FIGURES, figure(durations, "next call"))
    entries = [json.loads(p.read_text()) for p in client.spool.pending()]
    assert [e["kind"] for e in entries] == ["register"] * 20 + ["end"]
    assert all(ADMIN not in p.read_text() for p in client.spool.pending())
    service.start()

    # The job's next call, on a client with the default deadline: the replay of 21 calls
    # shares that call's deadline, and the 1 s of the outage client is not enough for 21
    # round trips to a service that has just started on a loaded machine.
    with Client(service.url, token=ADMIN, spool_dir=client.spool.directory) as later:
        started = time.monotonic()
        resumed = later.run(project, "run-1")  # any call that reaches it sends the spool first
        took = time.monotonic() - started

        assert resumed.id == run.id and resumed.status == "completed"
        assert later.spool.pending() == [] and later.spool.failed() == []
    assert_landed_once_in_order(service, run, ended)
    assert took < 10, took


def test_a_call_made_while_calls_wait_in_the_spool_queues_behind_them(
    service: Service, client: Client, project: str
) -> None:
    run = client.run(project, "run-1")
    service.stop()
    assert run.register(1, write_step(service.tier_dir("hot"), project, "run-1", 1)) is None
    service.start()

    second = run.register(2, write_step(service.tier_dir("hot"), project, "run-1", 2))

    assert second is not None and second.step == 2 and second.state == "active"
    assert client.spool.pending() == []
    with service.admin() as admin:
        events = admin.get("/v1/audit", params={"run_id": run.id, "limit": 100}).json()["items"]
    assert [e["after"]["step"] for e in events if e["event"] == "registered"] == [1, 2]


def test_a_save_started_in_an_outage_is_registered_whole_at_its_commit(
    service: Service, client: Client, project: str
) -> None:
    run = client.run(project, "run-1")
    service.stop()
    root = service.tier_dir("hot") / project / "run-1" / "step-10"
    with run.reserve(10, root, cls="milestone") as pending:
        assert pending.checkpoint is None  # unreserved: the catalog is away
        write_step(service.tier_dir("hot"), project, "run-1", 10)
        pending.metrics["eval_loss"] = 0.5
    assert pending.checkpoint is None and len(client.spool.pending()) == 1
    service.start()

    assert client.flush().landed == 1

    [checkpoint] = list(run.checkpoints())
    assert (checkpoint.step, checkpoint.cls, checkpoint.state) == (10, "milestone", "active")
    assert checkpoint.metrics == {"eval_loss": 0.5}


def test_a_refused_replay_is_set_aside_not_retried(
    service: Service, client: Client, project: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = client.run(project, "run-1")
    root = write_step(service.tier_dir("hot"), project, "run-1", 1)
    assert run.register(1, root) is not None
    service.stop()
    assert run.register(1, root, cls="final") is None  # will conflict with step 1
    assert run.register(2, write_step(service.tier_dir("hot"), project, "run-1", 2)) is None
    service.start()

    report = client.flush()

    assert report.landed == 1 and len(report.refused) == 1
    [(kept, error)] = report.refused
    assert error.status == 409 and kept.parent == client.spool.failed_dir
    refused = json.loads(kept.read_text())
    assert refused["refused"]["status"] == 409 and refused["body"]["class"] == "final"
    assert client.spool.pending() == [] and client.flush().landed == 0
    assert [c.step for c in run.checkpoints()] == [2, 1]
    assert any("refused the spooled step 1" in r.getMessage() for r in caplog.records)


def test_raise_instead_of_spooling(service: Service, spool_dir: Path, project: str) -> None:
    with Client(
        service.url, token=ADMIN, spool_dir=spool_dir, deadline=DEADLINE, on_unavailable="raise"
    ) as client:
        run = client.run(project, "run-1")
        service.stop()
        root = write_step(service.tier_dir("hot"), project, "run-1", 1)
        for call in (lambda: run.register(1, root), lambda: run.reserve(1, root), run.complete):
            started = time.monotonic()
            with pytest.raises(Unavailable) as unreachable:
                call()
            assert time.monotonic() - started <= DEADLINE + SLACK
            assert unreachable.value.status is None
            assert "did not answer in time" in str(unreachable.value)
    assert not spool_dir.exists()
