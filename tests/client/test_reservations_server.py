"""The parts of the client that need the service's reservations (DESIGN section 12) and its
checkpoint PATCH: `reserved_until` and keepalives, abort, and `update_checkpoint`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ckpt_client import Client, Conflict
from tests.client.conftest import Service, serve
from tests.client.helpers import write_step

TTL = 2.0  # seconds: the service's CKPT_RESERVATION_TTL in this module


class SaveFailed(Exception):
    pass


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, catalog_url: str) -> Iterator[Service]:
    """A service whose reservations lapse after TTL seconds without a keepalive."""
    root = tmp_path_factory.mktemp("service")
    yield from serve(root, catalog_url, CKPT_RESERVATION_TTL=f"{TTL:g}s")


def test_an_exception_in_the_block_aborts_and_is_reraised(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = service.tier_dir("hot") / project / "run-1" / "step-100"

    with pytest.raises(SaveFailed, match="disk full"), run.reserve(100, root) as pending:
        write_step(service.tier_dir("hot"), project, "run-1", 100)
        raise SaveFailed("disk full")

    assert pending.closed and pending.checkpoint is not None
    assert pending.checkpoint.state == "trashed"
    assert client.checkpoint(pending.checkpoint.id).state == "trashed"
    with service.admin() as admin:
        events = admin.get("/v1/audit", params={"checkpoint_id": pending.checkpoint.id}).json()
    assert any("disk full" in str(e) for e in events["items"]), events


def test_an_explicit_abort_names_its_reason(client: Client, service: Service, project: str) -> None:
    run = client.run(project, "run-1")
    reservation = run.reserve(200, service.tier_dir("hot") / project / "run-1" / "step-200")

    aborted = reservation.abort("the save was cancelled")

    assert aborted is not None and aborted.state == "trashed"
    assert reservation.abort() == aborted  # once closed, the same answer
    with pytest.raises(Conflict):  # the service refuses a second abort of it
        client._call("POST", f"/v1/checkpoints/{aborted.id}/abort", json={})


def test_an_open_reservation_is_kept_alive_past_its_ttl(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = service.tier_dir("hot") / project / "run-1" / "step-300"

    with run.reserve(300, root) as pending:
        assert pending.checkpoint is not None
        first = pending.checkpoint.reserved_until
        assert first is not None
        time.sleep(3 * TTL)  # a long save: the scheduler aborts what nobody keeps alive
        current = client.checkpoint(pending.checkpoint.id)
        assert current.state == "writing", current
        assert current.reserved_until is not None and current.reserved_until > first
        write_step(service.tier_dir("hot"), project, "run-1", 300)

    assert pending.keepalives_sent >= 4
    assert pending.checkpoint.state == "active" and pending.checkpoint.reserved_until is None


def test_a_reservation_nobody_keeps_alive_lapses_and_its_commit_is_refused(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = service.tier_dir("hot") / project / "run-1" / "step-400"
    reservation = run.reserve(400, root)
    assert reservation._keepalive is not None
    reservation._keepalive.stop()  # as if the job's process hung
    deadline = time.monotonic() + 90  # the scheduler looks at least every minute
    assert reservation.checkpoint is not None
    while client.checkpoint(reservation.checkpoint.id).state == "writing":
        assert time.monotonic() < deadline, "the lapsed reservation was never aborted"
        time.sleep(0.5)
    write_step(service.tier_dir("hot"), project, "run-1", 400)

    with pytest.raises(Conflict):
        reservation.commit()


def test_update_checkpoint_reclasses_and_merges(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = write_step(service.tier_dir("hot"), project, "run-1", 500)
    ckpt = run.register(500, root, metrics={"loss": 2.0}, labels={"a": "1"})
    assert ckpt is not None

    updated = client.update_checkpoint(
        ckpt.id, cls="final", labels={"b": "2"}, metrics={"eval_loss": 1.5}
    )

    assert updated.cls == "final"
    assert updated.labels == {"a": "1", "b": "2"}
    assert updated.metrics == {"loss": 2.0, "eval_loss": 1.5}
    assert client.checkpoint(ckpt.id) == updated
    only_class = client.update_checkpoint(ckpt.id, cls="milestone")
    assert only_class.labels == updated.labels and only_class.metrics == updated.metrics
    removed = client.update_checkpoint(ckpt.id, labels={"a": None}, metrics={"loss": None})
    assert removed.labels == {"b": "2"} and removed.metrics == {"eval_loss": 1.5}
