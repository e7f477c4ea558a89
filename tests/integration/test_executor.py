"""The worker on local tiers: the worked example of DESIGN section 1 end to end with the
shipped default policy, verified moves, pins that outrun a queued action, moves resumed after
a worker died mid-way, and restores (now or at a time)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.db.models import Action, Checkpoint, Location
from app.db.session import session_scope
from app.settings import Settings
from tests.builders import (
    ago,
    assert_problem,
    end_run,
    fetch_checkpoint,
    iso,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    step_dir,
    step_files,
    sweep_now,
    tier_usage,
    tree,
)

SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
PURGE_AT_ONCE = timedelta(0)

COLD_MILESTONES = """\
name: default
rules:
  - name: milestones-cold
    class: milestone
    when: {run_ended: 0s}
    action: {move_to: cold}
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
"""


def locations(client: TestClient, checkpoint_id: str) -> list[tuple[str, str, str]]:
    body = fetch_checkpoint(client, checkpoint_id)
    return sorted((loc["tier"], loc["role"], loc["uri"]) for loc in body["locations"])


def steps_on(data_dir: Path, tier: str, run: dict[str, Any]) -> list[int]:
    """The steps of `run` that have a directory on `tier`."""
    root = data_dir / tier / run["project"] / run["name"]
    if not root.is_dir():
        return []
    return sorted(int(p.name.removeprefix("step-")) for p in root.iterdir())


# --- the worked example with policies/default.yaml ----------------------------------------


@pytest.fixture
def shipped_client(app: FastAPI, settings: Settings) -> Iterator[TestClient]:
    """The app started with the shipped policy file in its policies directory."""
    settings.policies_dir.mkdir(parents=True)
    shutil.copy(SHIPPED_POLICY, settings.policies_dir / "default.yaml")
    with TestClient(app) as client:
        yield client


EVAL_LOSS = {1: 3.0, 2: 2.5, 3: 2.0, 4: 1.5, 5: 1.2, 6: 1.1, 7: 1.0, 8: 2.2}


def test_worked_example_end_to_end(
    shipped_client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    client = shipped_client
    worker = make_executor(app, trash_retention=PURGE_AT_ONCE)
    assert client.get("/v1/policies/default").json()["source"].endswith("default.yaml")
    run = make_run(client, "llm", "run-1")
    start = ago(days=40)
    rolling: dict[int, dict[str, Any]] = {}
    milestones: dict[int, dict[str, Any]] = {}

    # During the run: one milestone a "day", rolling checkpoints in between.
    for day in range(1, 9):
        milestones[day * 1000] = place_checkpoint(
            client,
            data_dir,
            run,
            day * 1000,
            "milestone",
            created_at=start + timedelta(days=day),
            metrics={"eval_loss": EVAL_LOSS[day]},
        )
        rolling[day * 1000 + 500] = place_checkpoint(
            client,
            data_dir,
            run,
            day * 1000 + 500,
            created_at=start + timedelta(days=day, hours=12),
        )
        sweep_now(client)
        worker.drain()
        newest_rolling = sorted(rolling)[-3:]
        on_hot = steps_on(data_dir, "hot", run)
        assert [s for s in on_hot if s % 1000 == 500] == newest_rolling
        assert [s for s in on_hot if s % 1000 == 0] == sorted(milestones)
    final = place_checkpoint(client, data_dir, run, 9000, "final", created_at=start + timedelta(9))
    sweep_now(client)
    worker.drain()

    for step, checkpoint in rolling.items():
        body = fetch_checkpoint(client, checkpoint["id"])
        assert body["state"] == ("active" if step in (6500, 7500, 8500) else "deleted"), body
    deletes = ledger(client, kind="delete")
    assert len(deletes) == 5
    assert {a["rule"] for a in deletes} == {"default/rolling-keep-3"}
    assert {a["rule"] for a in ledger(client, kind="purge")} == {"default/rolling-keep-3"}
    assert ledger(client, kind="move") == ledger(client, kind="copy") == []

    # Run ended 8 days ago: milestones thinned to the best 5 by eval_loss plus the last one;
    # the final is copied to archive.
    end_run(client, run["id"], ago(days=8))
    sweep_now(client)
    worker.drain()

    kept = [3000, 4000, 5000, 6000, 7000, 8000]
    for step, checkpoint in milestones.items():
        body = fetch_checkpoint(client, checkpoint["id"])
        assert body["state"] == ("active" if step in kept else "deleted"), body
        assert body["tier"] == ("hot" if step in kept else None)
    assert steps_on(data_dir, "hot", run) == sorted([*kept, 6500, 7500, 8500, 9000])
    milestone_ids = {c["id"] for c in milestones.values()}
    thinned = [a for a in ledger(client, kind="delete") if a["checkpoint_id"] in milestone_ids]
    assert len(thinned) == 2
    assert {a["rule"] for a in thinned} == {"default/milestones-thin"}
    assert steps_on(data_dir, "archive", run) == [9000]
    assert tree(step_dir(data_dir, "archive", run, 9000)) == step_files(9000)
    assert tree(step_dir(data_dir, "hot", run, 9000)) == step_files(9000)
    final_body = fetch_checkpoint(client, final["id"])
    assert final_body["tier"] == "hot"
    assert sorted((loc["tier"], loc["role"]) for loc in final_body["locations"]) == [
        ("archive", "replica"),
        ("hot", "primary"),
    ]
    assert steps_on(data_dir, "cold", run) == []

    # Ended 31 days ago: the remaining milestones move to cold.
    end_run(client, run["id"], ago(days=31))
    sweep_now(client)
    worker.drain()

    for step in kept:
        body = fetch_checkpoint(client, milestones[step]["id"])
        assert body["tier"] == "cold", body
        assert [(loc["tier"], loc["role"]) for loc in body["locations"]] == [("cold", "primary")]
        assert tree(step_dir(data_dir, "cold", run, step)) == step_files(step)
        assert not step_dir(data_dir, "hot", run, step).exists()
    assert steps_on(data_dir, "cold", run) == kept
    assert steps_on(data_dir, "hot", run) == [6500, 7500, 8500, 9000]
    assert steps_on(data_dir, "archive", run) == [9000]
    assert {a["rule"] for a in ledger(client, kind="move")} == {"default/milestones-cold"}
    assert len(ledger(client, kind="copy")) == 1
    assert {a["state"] for a in ledger(client)} == {"done"}
    assert sweep_now(client)["actions"] == []

    size = len(b"".join(step_files(0).values()))
    usage = tier_usage(client)
    assert usage["hot"] == {"bytes": 4 * size, "checkpoints": 4}
    assert usage["cold"] == {"bytes": 6 * size, "checkpoints": 6}
    assert usage["archive"] == {"bytes": size, "checkpoints": 1}
    assert usage["warm"] == {"bytes": 0, "checkpoints": 0}


# --- verification ---------------------------------------------------------------------------


@pytest.fixture
def cold_policy(client: TestClient) -> None:
    put_policy(client, COLD_MILESTONES)


def corrupt_same_size(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(bytes(b ^ 0xFF for b in data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


@pytest.mark.usefixtures("cold_policy")
@pytest.mark.parametrize("damage", [corrupt_same_size, truncate], ids=["checksum", "size"])
def test_move_that_fails_verification_keeps_the_source(
    client: TestClient, app: FastAPI, data_dir: Path, damage: Any
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 10, "milestone")
    source = step_dir(data_dir, "hot", run, 10)
    damage(source / "shard-0.bin")
    on_source = tree(source)
    before = locations(client, checkpoint["id"])
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]

    assert make_executor(app).drain() == 1

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "failed", action
    assert "verification" in action["error"], action
    assert action["finished_at"] is not None
    body = fetch_checkpoint(client, checkpoint["id"])
    assert body["state"] == "active"
    assert body["tier"] == "hot"
    assert locations(client, checkpoint["id"]) == before
    assert tree(source) == on_source
    assert tree(data_dir / "cold") == {}


@pytest.mark.usefixtures("cold_policy")
def test_move_without_checksums_verifies_sizes_and_succeeds(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 10, "milestone", checksums=False)
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]

    assert make_executor(app).drain() == 1

    assert client.get(f"/v1/actions/{move}").json()["state"] == "done"
    assert fetch_checkpoint(client, checkpoint["id"])["tier"] == "cold"
    assert tree(step_dir(data_dir, "cold", run, 10)) == step_files(10)
    assert tree(data_dir / "hot") == {}


@pytest.mark.usefixtures("cold_policy")
def test_a_finished_move_logs_how_long_each_phase_took(
    client: TestClient, app: FastAPI, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What an operator reads when a move is slow: one `transfer phases` line with the
    seconds of the copy, the verification, the catalog switch and the source's removal."""
    run = make_run(client)
    place_checkpoint(client, data_dir, run, 10, "milestone")
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]
    caplog.set_level("INFO", logger="app.worker")

    assert make_executor(app).drain() == 1

    (line,) = [r for r in caplog.records if r.getMessage() == "transfer phases"]
    phases = {k: v for k, v in vars(line).items() if k.endswith("_s")}
    assert set(phases) == {"total_s", "copy_s", "verify_s", "switch_s", "remove_source_s"}
    assert (vars(line)["action_id"], vars(line)["kind"]) == (move, "move")
    assert all(v >= 0 for v in phases.values())
    assert phases["total_s"] >= sum(v for k, v in phases.items() if k != "total_s") - 0.01


# --- pins win over queued actions ---------------------------------------------------------


@pytest.mark.usefixtures("cold_policy")
def test_pinning_cancels_a_queued_move_and_delete_but_not_a_copy(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    old = place_checkpoint(client, data_dir, run, 1)
    place_checkpoint(client, data_dir, run, 2)
    milestone = place_checkpoint(client, data_dir, run, 10, "milestone")
    final = place_checkpoint(client, data_dir, run, 20, "final")
    end_run(client, run["id"], ago(hours=1))
    result = sweep_now(client)
    assert len(result["actions"]) == 3
    disk = tree(data_dir / "hot")
    for checkpoint in (old, milestone, final):
        pinned = client.post(f"/v1/checkpoints/{checkpoint['id']}/pin", json={"reason": "paper"})
        assert pinned.status_code == 200, pinned.text

    assert make_executor(app).drain() == 3

    by_kind = {a["kind"]: a for a in ledger(client)}
    assert by_kind["delete"]["state"] == "cancelled"
    assert by_kind["move"]["state"] == "cancelled"
    assert "pinned" in by_kind["delete"]["error"] and "pinned" in by_kind["move"]["error"]
    assert by_kind["copy"]["state"] == "done"
    assert fetch_checkpoint(client, old["id"])["state"] == "active"
    assert fetch_checkpoint(client, milestone["id"])["tier"] == "hot"
    assert tree(data_dir / "hot") == disk
    assert tree(data_dir / "cold") == {}
    assert tree(step_dir(data_dir, "archive", run, 20)) == step_files(20)


# --- a worker killed mid-move -------------------------------------------------------------


def simulate_dead_worker(
    app: FastAPI,
    client: TestClient,
    data_dir: Path,
    run: dict[str, Any],
    checkpoint: dict[str, Any],
    action_id: str,
    crashed_after: str,
) -> str:
    """Leave the disk, the catalog and the action row as a worker killed right after
    `crashed_after` would have: the action `running`, its lease still held for 30 s."""
    source = step_dir(data_dir, "hot", run, checkpoint["step"])
    dest = step_dir(data_dir, "cold", run, checkpoint["step"])
    tiers = {t.name: t for t in app.state.tiers}
    dest_uri: str = tiers["cold"].parsed.join(f"{run['project']}/{run['name']}/step-10")
    step: str | None = crashed_after
    if crashed_after == "copying":  # killed inside the copy: one file whole, one half written
        dest.mkdir(parents=True)
        first, *_ = sorted(source.iterdir())
        shutil.copyfile(first, dest / first.name)
        (dest / ".shard-1.bin.partial-0123abcd").write_bytes(b"half")
        step = None
    else:
        shutil.copytree(source, dest)
    now = datetime.now(UTC)
    with session_scope(app.state.session_factory) as session:
        if crashed_after in ("switched", "removed"):
            session.execute(
                update(Location)
                .where(Location.checkpoint_id == checkpoint["id"])
                .values(tier="cold", uri=dest_uri)
            )
            session.execute(  # the switch moves the row's uri and tier with its primary
                update(Checkpoint)
                .where(Checkpoint.id == checkpoint["id"])
                .values(tier="cold", uri=dest_uri)
            )
        session.execute(
            update(Action)
            .where(Action.id == action_id)
            .values(
                state="running",
                step=step,
                attempts=1,
                source_uri=checkpoint["uri"],
                dest_uri=dest_uri,
                lease_owner="dead-host:1234",
                lease_until=now + timedelta(seconds=30),
                updated_at=now,
            )
        )
    if crashed_after == "removed":
        shutil.rmtree(source)
    return dest_uri


@pytest.mark.usefixtures("cold_policy")
@pytest.mark.parametrize("crashed_after", ["copying", "copied", "switched", "removed"])
def test_a_dead_workers_move_is_resumed_by_the_next(
    client: TestClient, app: FastAPI, data_dir: Path, crashed_after: str
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 10, "milestone")
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]
    dest_uri = simulate_dead_worker(app, client, data_dir, run, checkpoint, move, crashed_after)
    # readable from a catalogued location whatever the crash point
    (location,) = fetch_checkpoint(client, checkpoint["id"])["locations"]
    assert tree(Path(location["uri"].removeprefix("file://"))) == step_files(10)

    assert make_executor(app).drain() == 0  # the lease is still held
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert make_executor(app, clock=lambda: later).drain() == 1

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "done", action
    assert action["attempts"] == 2
    assert action["error"] is None
    body = fetch_checkpoint(client, checkpoint["id"])
    assert body["tier"] == "cold"
    assert [(loc["tier"], loc["role"], loc["uri"]) for loc in body["locations"]] == [
        ("cold", "primary", dest_uri)
    ]
    expected = {f"proj/run-1/step-10/{path}": data for path, data in step_files(10).items()}
    assert tree(data_dir / "cold") == expected
    assert tree(data_dir / "hot") == {}


# --- restore ----------------------------------------------------------------------------------


@pytest.fixture
def on_cold(client: TestClient, data_dir: Path) -> dict[str, Any]:
    run = make_run(client)
    return place_checkpoint(client, data_dir, run, 10, "milestone", tier="cold")


def test_restore_stages_a_replica_on_hot(
    client: TestClient, app: FastAPI, data_dir: Path, on_cold: dict[str, Any]
) -> None:
    run = client.get(f"/v1/runs/{on_cold['run_id']}").json()
    assert on_cold["tier"] == "cold"

    response = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot"})

    assert response.status_code == 202, response.text
    action = response.json()
    assert (action["kind"], action["from_tier"], action["to_tier"]) == ("restore", "cold", "hot")
    assert (action["rule"], action["state"]) == ("manual", "pending")
    again = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot"})
    assert again.status_code == 202 and again.json()["id"] == action["id"]
    assert make_executor(app).drain() == 1
    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "done"
    body = fetch_checkpoint(client, on_cold["id"])
    assert body["tier"] == "cold"
    assert sorted((loc["tier"], loc["role"]) for loc in body["locations"]) == [
        ("cold", "primary"),
        ("hot", "replica"),
    ]
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)
    assert tree(step_dir(data_dir, "cold", run, 10)) == step_files(10)


def test_restore_at_a_time_waits_for_it(
    client: TestClient, app: FastAPI, data_dir: Path, on_cold: dict[str, Any]
) -> None:
    run = client.get(f"/v1/runs/{on_cold['run_id']}").json()
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)

    response = client.post(
        f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot", "at": iso(at)}
    )

    assert response.status_code == 202, response.text
    action = response.json()
    assert datetime.fromisoformat(action["due_at"]) == at
    assert make_executor(app).drain() == 0
    assert make_executor(app, clock=lambda: at - timedelta(seconds=1)).drain() == 0
    assert not step_dir(data_dir, "hot", run, 10).exists()
    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "pending"
    assert make_executor(app, clock=lambda: at + timedelta(seconds=1)).drain() == 1
    assert client.get(f"/v1/actions/{action['id']}").json()["state"] == "done"
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)


def test_restore_at_a_past_time_is_due_now(
    client: TestClient, app: FastAPI, on_cold: dict[str, Any]
) -> None:
    response = client.post(
        f"/v1/checkpoints/{on_cold['id']}/restore",
        json={"tier": "hot", "at": iso(ago(hours=1))},
    )

    assert response.status_code == 202, response.text
    assert make_executor(app).drain() == 1


def test_restore_to_a_tier_that_holds_it_is_a_409_naming_tier(
    client: TestClient, app: FastAPI, data_dir: Path, on_cold: dict[str, Any]
) -> None:
    before = fetch_checkpoint(client, on_cold["id"])

    response = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "cold"})

    body = assert_problem(response, 409, "tier")
    assert "primary" in body["detail"] and "cold" in body["detail"]
    assert ledger(client) == []
    assert make_executor(app).drain() == 0
    assert fetch_checkpoint(client, on_cold["id"])["locations"] == before["locations"]
    assert tree(data_dir / "hot") == {}


def test_restore_to_a_tier_holding_a_replica_is_a_409_too(
    client: TestClient, app: FastAPI, on_cold: dict[str, Any]
) -> None:
    first = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot"})
    assert first.status_code == 202, first.text
    assert make_executor(app).drain() == 1

    again = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot"})

    assert "replica" in assert_problem(again, 409, "tier")["detail"]
    assert [a["id"] for a in ledger(client)] == [first.json()["id"]]


def test_an_action_answers_the_checkpoint_step_and_the_worker_phase_apart(
    client: TestClient, app: FastAPI, on_cold: dict[str, Any]
) -> None:
    queued = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": "hot"})
    assert queued.status_code == 202, queued.text
    action = queued.json()
    assert (action["step"], action["phase"], action["bytes_done"]) == (10, None, 0)

    assert make_executor(app).drain() == 1

    for done in (client.get(f"/v1/actions/{action['id']}").json(), *ledger(client)):
        assert done["step"] == 10 and done["step"] == on_cold["step"]
        assert done["state"] == "done" and done["phase"] == "switched"
        assert isinstance(done["bytes_done"], int)


@pytest.mark.parametrize("tier", ["tape", "Hot!", ""])
def test_restore_to_an_unknown_tier_is_422(
    client: TestClient, on_cold: dict[str, Any], tier: str
) -> None:
    response = client.post(f"/v1/checkpoints/{on_cold['id']}/restore", json={"tier": tier})

    assert_problem(response, 422, "tier")
    assert ledger(client) == []


def test_restore_of_an_unknown_checkpoint_is_404(client: TestClient) -> None:
    assert_problem(client.post("/v1/checkpoints/ckp_nothing/restore", json={"tier": "hot"}), 404)


def mark_running(app: FastAPI, action_id: str, step: str) -> None:
    """Only the action row says how far it got: running under an expired lease."""
    expired = datetime.now(UTC) - timedelta(seconds=1)
    with session_scope(app.state.session_factory) as session:
        session.execute(
            update(Action)
            .where(Action.id == action_id)
            .values(state="running", step=step, attempts=1, lease_until=expired)
        )


@pytest.mark.usefixtures("cold_policy")
@pytest.mark.parametrize("step", ["copied", "switched"])
def test_a_record_ahead_of_the_catalog_never_costs_the_source(
    client: TestClient, app: FastAPI, data_dir: Path, step: str
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 10, "milestone")
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]
    mark_running(app, move, step)  # nothing was copied, the catalog was never switched

    assert make_executor(app).drain() == 1

    action = client.get(f"/v1/actions/{move}").json()
    assert action["state"] == "failed", action
    assert "verification" in action["error"]
    assert fetch_checkpoint(client, checkpoint["id"])["locations"] == checkpoint["locations"]
    assert tree(step_dir(data_dir, "hot", run, 10)) == step_files(10)
    assert tree(data_dir / "cold") == {}


@pytest.mark.usefixtures("cold_policy")
def test_a_switched_record_with_the_copy_in_place_switches_the_catalog(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 10, "milestone")
    end_run(client, run["id"], ago(hours=1))
    (move,) = sweep_now(client)["actions"]
    shutil.copytree(step_dir(data_dir, "hot", run, 10), step_dir(data_dir, "cold", run, 10))
    mark_running(app, move, "switched")  # the copy is there, the catalog still says hot

    assert make_executor(app).drain() == 1

    assert client.get(f"/v1/actions/{move}").json()["state"] == "done"
    body = fetch_checkpoint(client, checkpoint["id"])
    assert [(loc["tier"], loc["role"]) for loc in body["locations"]] == [("cold", "primary")]
    assert tree(step_dir(data_dir, "cold", run, 10)) == step_files(10)
    assert tree(data_dir / "hot") == {}
