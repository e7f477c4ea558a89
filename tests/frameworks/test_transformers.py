"""The Hugging Face Trainer with `ckpt_client.transformers.CatalogCallback`, against `ckpt
serve` on PostgreSQL: a two-layer GPT-2 of width 32 trained on random tokens on the CPU
(tests/frameworks/transformers_train.py, run with the frameworks' Python).

The service protects every checkpoint less than 60 s old, and these trainings last
seconds: before a sweep, a test ages the run's checkpoints in the catalog (their
`created_at` moved back), as if the training had been a while ago, and the service's own
worker then does what the sweep planned, with the real clock.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db.models import Checkpoint
from app.db.session import make_engine, make_session_factory, session_scope
from app.services.lifecycle.trash import enqueue_due_purges
from ckpt_client import Client
from tests.client.conftest import ADMIN, Service
from tests.frameworks.conftest import TRAIN_TIMEOUT, Training, abandon_due

SCRIPT = Path(__file__).resolve().parent / "transformers_train.py"
SETTLE_TIMEOUT = 60.0
# What every save of the Trainer holds, trainer_state.json written last, so a directory
# with it is complete (the model's own files besides: config.json, model.safetensors, ...).
TRAINER_FILES = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}


@pytest.fixture
def admin(service: Service) -> Iterator[httpx.Client]:
    with service.admin() as client:
        yield client


def put_policy(admin: httpx.Client, project: str, *rules: dict[str, Any]) -> None:
    """A policy for the test's project alone."""
    document = {"applies_to": {"projects": [project]}, "priority": 10, "rules": list(rules)}
    answer = admin.put(f"/v1/policies/{project}", json=document)
    assert answer.status_code == 200, answer.text


def rolling(keep: int) -> dict[str, Any]:
    return {"name": "rolling", "class": "rolling", "keep_last": keep, "action": "delete"}


def run_of(admin: httpx.Client, project: str) -> dict[str, Any]:
    (run,) = admin.get("/v1/runs", params={"project": project}).json()["items"]
    assert isinstance(run, dict)
    return run


def checkpoints(admin: httpx.Client, run_id: str, state: str | None = None) -> dict[int, Any]:
    """The run's checkpoints by step, every state unless `state` says which."""
    query: dict[str, Any] = {"limit": 500, **({"state": state} if state else {})}
    items = admin.get(f"/v1/runs/{run_id}/checkpoints", params=query).json()["items"]
    return {int(c["step"]): c for c in items}


def saved(output_dir: Path) -> list[int]:
    """The steps of the checkpoint directories on disk."""
    return sorted(int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*"))


def files_of(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()
    }


def assert_whole(checkpoint: dict[str, Any]) -> None:
    """An active checkpoint's manifest is a whole save, and its files are on disk as listed."""
    manifest = {f["path"]: f["size_bytes"] for f in checkpoint["files"]}
    assert TRAINER_FILES | {"model.safetensors"} <= set(manifest), manifest
    root = Path(checkpoint["uri"].removeprefix("file://"))
    assert files_of(root) == manifest


def age(catalog_url: str, run_id: str, by: timedelta = timedelta(minutes=2)) -> None:
    """Move the run's checkpoints' `created_at` back by `by`: past the service's 60 s
    protection of new checkpoints, as if the training had happened that long ago."""
    engine = make_engine(catalog_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            for checkpoint in session.scalars(
                select(Checkpoint).where(Checkpoint.run_id == run_id)
            ):
                checkpoint.created_at -= by
    finally:
        engine.dispose()


def sweep(admin: httpx.Client, catalog_url: str, run_id: str) -> list[str]:
    """A sweep of the run through the API, and everything it planned done by the service's
    worker, purges included (enqueued now rather than at the scheduler's next round)."""
    answer = admin.post("/v1/sweeps", json={"run_id": run_id})
    assert answer.status_code == 202, answer.text
    planned: list[str] = answer.json()["actions"]
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        actions = admin.get("/v1/actions", params={"run_id": run_id, "limit": 500}).json()
        states = {a["id"]: a["state"] for a in actions["items"]}
        assert "held" not in states.values(), actions
        busy = any(state in ("pending", "running") for state in states.values())
        trashed = checkpoints(admin, run_id, state="trashed")
        if not busy and not trashed:
            assert all(states[a] == "done" for a in planned), actions
            return planned
        if not busy:
            engine = make_engine(catalog_url)
            try:
                with session_scope(make_session_factory(engine)) as session:
                    enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC))
            finally:
                engine.dispose()
        time.sleep(0.2)
    pytest.fail(f"the sweep of {run_id} did not settle in {SETTLE_TIMEOUT}s")


def argv(output_dir: Path, project: str, options: str, scores: Any = None) -> list[str]:
    """The training script's arguments for the project's `run-1`: `options` split at spaces,
    and the evaluation's scripted `score` by step."""
    scripted = [] if scores is None else ["--scores", json.dumps(scores)]
    return [str(output_dir), project, "run-1", *options.split(), *scripted]


def wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TRAIN_TIMEOUT
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the training exited {process.returncode} first:\n{out}\n{err[-6000:]}")
        assert time.monotonic() < deadline, f"no {path} after {TRAIN_TIMEOUT}s"
        time.sleep(0.05)


def await_steps(
    admin: httpx.Client, run_id: str, steps: set[int], state: str | None = None
) -> None:
    """Wait until the run has checkpoints of `steps` (in `state`): the callback registers
    from a thread of its own, so the last save's may still be on its way."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while not steps <= set(checkpoints(admin, run_id, state)):
        assert time.monotonic() < deadline, f"steps {steps} not registered"
        time.sleep(0.05)


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


def test_a_training_ends_with_the_checkpoints_the_policy_keeps(
    training: Training, service: Service, admin: httpx.Client, catalog_url: str, project: str
) -> None:
    put_policy(
        admin,
        project,
        rolling(1),
        {
            "name": "final-archive",
            "class": "final",
            "when": {"run_ended": "0s"},
            "action": {"copy_to": "archive"},
        },
    )
    output_dir = service.tier_dir("hot") / project / "run-1"
    # the best score is at step 2, then 6, then 8; steps 6 and 12 are milestones by step
    scores = {"2": 0.5, "4": 0.45, "6": 0.7, "8": 0.8, "10": 0.6, "12": 0.75}
    done = training.run(
        SCRIPT,
        *argv(output_dir, project, "--max-steps 12 --milestone-every 6 --metric score", scores),
    )
    assert "save_total_limit" not in done.stderr
    run = run_of(admin, project)
    assert run["status"] == "completed"
    # the Trainer deleted nothing itself
    assert saved(output_dir) == [2, 4, 6, 8, 10, 12]
    registered = checkpoints(admin, run["id"])
    assert {s: c["class"] for s, c in registered.items()} == {
        2: "rolling",  # the best once, back to rolling when 6 beat it
        4: "rolling",
        6: "milestone",  # the best once, and a milestone by step
        8: "milestone",  # the best
        10: "rolling",
        12: "final",  # the last save
    }
    assert {s for s, c in registered.items() if c["labels"].get("best") == "eval_score"} == {8}
    for step, checkpoint in registered.items():
        assert checkpoint["metrics"]["eval_score"] == scores[str(step)]
        assert "eval_loss" in checkpoint["metrics"]
        assert checkpoint["uri"] == f"file://{output_dir}/checkpoint-{step}"
        assert_whole(checkpoint)

    age(catalog_url, run["id"])
    sweep(admin, catalog_url, run["id"])

    after = checkpoints(admin, run["id"])
    assert {s: c["state"] for s, c in after.items()} == {
        2: "deleted",
        4: "deleted",
        6: "active",
        8: "active",
        10: "active",
        12: "active",
    }
    assert saved(output_dir) == [6, 8, 10, 12]
    assert {loc["tier"] for loc in after[12]["locations"]} == {"hot", "archive"}


def test_a_save_killed_mid_write_is_never_active_and_the_job_resumes_from_the_last_whole_one(
    training: Training,
    service: Service,
    admin: httpx.Client,
    catalog_url: str,
    project: str,
    tmp_path: Path,
) -> None:
    put_policy(admin, project, rolling(2))
    output_dir = service.tier_dir("hot") / project / "run-1"
    held = tmp_path / "held"
    held.mkdir()
    job = training.start(
        SCRIPT, *argv(output_dir, project, f"--max-steps 16 --hold save:10 --hold-dir {held}")
    )
    try:
        wait_for(held / "held", job)
        # Step 10 is half written: weights, optimizer and scheduler, not yet its RNG state
        # nor trainer_state.json; the catalog has not heard of it.
        torn = output_dir / "checkpoint-10"
        written = files_of(torn)
        assert {"model.safetensors", "optimizer.pt"} <= set(written)
        assert not {"rng_state.pth", "trainer_state.json"} & set(written)
        run = run_of(admin, project)
        await_steps(admin, run["id"], {2, 4, 6, 8})
        assert sorted(checkpoints(admin, run["id"])) == [2, 4, 6, 8]
        # A sweep while the save is being written deletes what the policy says among the
        # registered ones and leaves the one being written alone.
        age(catalog_url, run["id"])
        sweep(admin, catalog_url, run["id"])
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
        assert states == {2: "deleted", 4: "deleted", 6: "active", 8: "active"}
        assert files_of(torn) == written
    finally:
        kill(job)

    # Killed mid-save: the torn directory stays unknown to the catalog, in no state; there
    # is no reservation for the scheduler to abort; what is active is whole.
    after = checkpoints(admin, run["id"])
    assert sorted(after) == [2, 4, 6, 8]
    assert abandon_due(catalog_url, datetime.now(UTC) + timedelta(hours=2)) == []
    for checkpoint in checkpoints(admin, run["id"], state="active").values():
        assert_whole(checkpoint)
    assert run_of(admin, project)["status"] == "active"

    (held / "held").unlink()
    # Restarted with resume_path: from step 8, the newest whole save (not the torn 10, the
    # highest-numbered directory, which transformers' own get_last_checkpoint would pick),
    # and trained on past the saves that push 8 out of the policy's last two. The
    # checkpoint it resumed from survives every sweep while the run is active.
    job = training.start(
        SCRIPT,
        *argv(
            output_dir,
            project,
            f"--max-steps 16 --resume --hold step:15 --hold-dir {held} --save-total-limit 50",
        ),
    )
    try:
        wait_for(held / "held", job)
        resumed = checkpoints(admin, run["id"])
        run = run_of(admin, project)
        assert run["resumed_from"] == resumed[8]["id"]
        # (6 may be gone already: aged above, the evaluations of the new registrations
        # may delete it)
        await_steps(admin, run["id"], {8, 10, 12, 14}, state="active")
        age(catalog_url, run["id"])
        sweep(admin, catalog_url, run["id"])
        active = checkpoints(admin, run["id"], state="active")
        assert sorted(active) == [8, 12, 14]  # 8: resumed from; 12, 14: the last two
        (held / "go").touch()
        out, err = job.communicate(timeout=TRAIN_TIMEOUT)
    finally:
        if job.poll() is None:
            kill(job)
    assert job.returncode == 0, err[-6000:]
    assert f"resumed from {output_dir / 'checkpoint-8'} at step 8" in out
    assert "trained to step 16" in out
    # a limit far above the saves: the Trainer deleted nothing, the callback still warned
    assert "save_total_limit=50: the Trainer deletes checkpoints itself" in err
    assert run_of(admin, project)["status"] == "completed"
    # Ended, the run's resumed_from is protected no more: the policy's rule applies to it.
    sweep(admin, catalog_url, run["id"])
    final = checkpoints(admin, run["id"], state="active")
    assert sorted(final) == [12, 14, 16]
    assert final[16]["class"] == "final"
    assert_whole(final[16])
    assert saved(output_dir) == [12, 14, 16]
    # the torn 10 was saved again whole by the resumed job before it was registered (and
    # later deleted by the policy: its record keeps the manifest)
    assert {f["path"] for f in checkpoints(admin, run["id"])[10]["files"]} >= TRAINER_FILES


def test_a_job_resumes_from_a_checkpoint_moved_to_cold_staged_back_onto_hot(
    training: Training, service: Service, admin: httpx.Client, catalog_url: str, project: str
) -> None:
    put_policy(
        admin,
        project,
        {
            "name": "finals-cold",
            "class": "final",
            "when": {"run_ended": "0s"},
            "action": {"move_to": "cold"},
        },
    )
    output_dir = service.tier_dir("hot") / project / "run-1"
    # save_strategy="best": the Trainer saves step 2 alone (4 scores worse), so the last
    # save is not the end of training and the callback promotes it to final at the end;
    # the best is the Trainer's own metric_for_best_model
    training.run(
        SCRIPT,
        *argv(output_dir, project, "--max-steps 4 --save-strategy best", {"2": 0.9, "4": 0.5}),
    )
    run = run_of(admin, project)
    (first,) = checkpoints(admin, run["id"]).values()
    assert (first["step"], first["class"], first["labels"]) == (2, "final", {"best": "eval_score"})
    age(catalog_url, run["id"])
    sweep(admin, catalog_url, run["id"])
    moved = checkpoints(admin, run["id"])[2]
    assert [loc["tier"] for loc in moved["locations"]] == ["cold"]
    assert saved(output_dir) == []

    # The best so far (2, final and labelled) is known again after the restart: 4 does not
    # beat it; 6 does, and 2 loses the label but stays final.
    scores = {"4": 0.85, "6": 0.95, "8": 0.2}
    options = "--max-steps 8 --resume --metric score"
    done = training.run(SCRIPT, *argv(output_dir, project, options, scores))
    staged = output_dir / "step-2"  # where the service places step 2 on hot
    assert f"resumed from {staged} at step 2" in done.stdout
    assert "trained to step 8" in done.stdout
    after = checkpoints(admin, run["id"])
    assert {loc["tier"]: loc["role"] for loc in after[2]["locations"]} == {
        "cold": "primary",
        "hot": "replica",
    }
    assert {s: c["class"] for s, c in after.items()} == {
        2: "final",
        4: "rolling",
        6: "milestone",
        8: "final",
    }
    assert {s for s, c in after.items() if c["labels"].get("best") == "eval_score"} == {6}
    run = run_of(admin, project)
    assert (run["status"], run["resumed_from"]) == ("completed", after[2]["id"])
    # the ended run was reopened while the job trained on it
    events = admin.get("/v1/audit", params={"run_id": run["id"], "limit": 500}).json()["items"]
    changes = [e["after"] for e in events if e["entity"] == "run" and e["after"]]
    statuses = [c["status"] for c in changes if "status" in c]
    assert statuses == ["active", "completed", "active", "completed"]


def test_a_training_outlives_an_outage_of_the_catalog(
    training: Training, service: Service, admin: httpx.Client, project: str, tmp_path: Path
) -> None:
    output_dir = service.tier_dir("hot") / project / "run-1"
    held = tmp_path / "held"
    held.mkdir()
    job = training.start(
        SCRIPT,
        *argv(output_dir, project, f"--max-steps 6 --deadline 1 --hold step:3 --hold-dir {held}"),
    )
    try:
        wait_for(held / "held", job)
        await_steps(admin, run_of(admin, project)["id"], {2})
        service.stop()
        (held / "go").touch()
        released = time.monotonic()
        out, err = job.communicate(timeout=TRAIN_TIMEOUT)
        took = time.monotonic() - released
    finally:
        if job.poll() is None:
            kill(job)
        service.start()
    # Saves 4 and 6 and the run's end were spooled, each after its one-second deadline.
    assert job.returncode == 0, err[-6000:]
    assert "trained to step 6" in out
    assert err.count("the catalog is unreachable") == 3, err[-6000:]
    assert "made final" not in err  # the last save was registered final, spooled
    assert took < 30
    run = run_of(admin, project)
    assert run["status"] == "active"
    assert sorted(checkpoints(admin, run["id"])) == [2]

    with Client(service.url, token=ADMIN, spool_dir=training.spool_dir) as client:
        report = client.flush()
    assert (report.landed, report.refused) == (3, [])
    assert run_of(admin, project)["status"] == "completed"
    registered = checkpoints(admin, run["id"])
    assert {s: c["class"] for s, c in registered.items()} == {
        2: "rolling",
        4: "rolling",
        6: "final",
    }
    for checkpoint in registered.values():
        assert_whole(checkpoint)


def test_an_output_dir_the_service_cannot_read_is_refused_before_training(
    training: Training, admin: httpx.Client, project: str, tmp_path: Path
) -> None:
    output_dir = tmp_path / "not-a-tier"
    job = training.start(SCRIPT, *argv(output_dir, project, "--max-steps 4"))
    out, err = job.communicate(timeout=TRAIN_TIMEOUT)
    assert job.returncode != 0
    assert f"output_dir {output_dir} lies under none of the catalog's local tiers" in err
    assert "trained to step" not in out
    assert admin.get("/v1/runs", params={"project": project}).json()["items"] == []
    assert not list(output_dir.glob("checkpoint-*"))
