"""torch.distributed.checkpoint through `ckpt_client.dcp`, against `ckpt serve`: a tiny
training (tests/frameworks/scripts/dcp_train.py) saves with DCP on gloo, in a thread, in
DCP's checkpoint process and synchronously; each save is reserved, then committed with
the files its write results name, or aborted when it fails; a restarted job resumes from
what the catalog says with `dcp.load`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_client import Client, Run
from tests.client.conftest import ADMIN, Service
from tests.frameworks.conftest import TRAIN_TIMEOUT, Training, abandon_due
from tests.frameworks.support import (
    back_date,
    checkpoints,
    files,
    kill,
    poll,
    put_policy,
    read_until,
    run_of,
    sweep_and_settle,
)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "dcp_train.py"
DATA_FILE = "__0_0.distcp"  # rank 0's one file (single_file_per_rank, one writer thread)


@pytest.fixture
def catalog(service: Service, tmp_path: Path) -> Iterator[Client]:
    """The test's own view of the catalog, as an admin."""
    with Client(service.url, token=ADMIN, spool_dir=tmp_path / "test-spool") as client:
        yield client


def train(
    training: Training, tmp_path: Path, project: str, *args: str, name: str = "run-1"
) -> dict[str, Any]:
    """Run the training to its end; its report (rank 0's)."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    root = training.service.tier_dir("hot") / project / name
    training.run(
        SCRIPT,
        "--project",
        project,
        "--run",
        name,
        "--root",
        str(root),
        "--report",
        str(report),
        *args,
    )
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def assert_committed(
    save: dict[str, Any], service: Service, project: str, metadata_file: str = ".metadata"
) -> dict[str, Any]:
    """The save is active in the catalog with exactly the files it wrote: the data files
    sized as their write results' extents, and the metadata file."""
    assert "error" not in save, save
    checkpoint: dict[str, Any] = save["checkpoint"]
    step = save["step"]
    assert checkpoint["state"] == "active"
    assert checkpoint["step"] == step
    assert checkpoint["class"] == "rolling"
    assert "loss" in checkpoint["metrics"]
    directory = service.tier_dir("hot") / project / "run-1" / f"step-{step}"
    assert checkpoint["uri"] == f"file://{directory}"
    assert checkpoint["files"] == save["on_disk"]
    assert set(checkpoint["files"]) == {*save["extents"], metadata_file}
    for name, end in save["extents"].items():
        assert checkpoint["files"][name] == end
    assert checkpoint["size_bytes"] == sum(save["on_disk"].values())
    return checkpoint


def test_async_saves_in_a_thread_are_committed_with_their_files_and_resumed(
    training: Training, tmp_path: Path, project: str, catalog: Client
) -> None:
    first = train(training, tmp_path, project, "--save-at", "2,4", "--mode", "thread")
    assert first["errors"] == []
    assert [s["step"] for s in first["saves"]] == [2, 4]
    for save in first["saves"]:
        assert_committed(save, training.service, project)
        assert set(save["extents"]) == {DATA_FILE}

    run = catalog.find_run(project, "run-1")
    assert run is not None
    listed = {c.step: c for c in run.checkpoints()}
    assert sorted(listed) == [2, 4]
    assert {c.state for c in listed.values()} == {"active"}
    assert listed[4].id == first["saves"][1]["checkpoint"]["id"]

    # a restarted job: the newest checkpoint, loaded with dcp.load, then on from its step
    again = train(training, tmp_path, project, "--resume", "--save-at", "6", "--mode", "thread")
    step_4 = training.service.tier_dir("hot") / project / "run-1" / "step-4"
    assert again["resumed_from"] == str(step_4)
    assert again["loaded_step"] == 4
    assert again["loaded_weights"] == first["weights"]["4"]
    assert [s["step"] for s in again["saves"]] == [6]
    assert_committed(again["saves"][0], training.service, project)
    assert again["weights"]["6"] != first["weights"]["4"]


def test_async_saves_in_the_checkpoint_process_are_committed(
    training: Training, tmp_path: Path, project: str
) -> None:
    report = train(training, tmp_path, project, "--save-at", "2,3", "--mode", "process")
    assert report["errors"] == []
    assert [s["step"] for s in report["saves"]] == [2, 3]
    for save in report["saves"]:
        assert_committed(save, training.service, project)


def test_background_staging_waits_for_the_upload_before_the_commit(
    training: Training, tmp_path: Path, project: str
) -> None:
    """A stager that stages in the background: DCP answers an AsyncSaveResponse, whose
    upload completion (not its staging) commits."""
    report = train(
        training, tmp_path, project, "--save-at", "2", "--mode", "thread", "--async-staging"
    )
    assert report["errors"] == []
    assert_committed(report["saves"][0], training.service, project)


def test_a_save_without_collectives_is_committed_with_its_rank_metadata_file(
    training: Training, tmp_path: Path, project: str
) -> None:
    report = train(
        training, tmp_path, project, "--save-at", "2", "--mode", "thread", "--no-collectives"
    )
    assert report["errors"] == []
    assert_committed(report["saves"][0], training.service, project, "__0.metadata")


@pytest.mark.parametrize("mode", ["thread", "process", "sync"])
def test_a_failed_save_aborts_its_reservation(
    training: Training, tmp_path: Path, project: str, catalog: Client, mode: str
) -> None:
    report = train(
        training, tmp_path, project, "--save-at", "2,3", "--fail-at", "2", "--mode", mode
    )
    failed, saved = report["saves"]
    assert failed["step"] == 2
    assert "No space left on device (injected)" in failed["error"]
    assert_committed(saved, training.service, project)

    run = catalog.find_run(project, "run-1")
    assert run is not None
    states = {c.step: c.state for c in run.checkpoints()}
    assert states[3] == "active"
    assert states[2] in ("trashed", "deleted")  # the service purges the trash at once
    aborted = catalog.call("GET", "/v1/audit", params={"checkpoint_id": _id(run, 2)})
    reasons = [e for e in aborted["items"] if e.get("event") == "aborted"]
    assert reasons, aborted
    assert "No space left on device" in json.dumps(reasons[0])
    # the failed save is not where a restarted job resumes from
    latest = run.latest()
    assert latest is not None and latest.step == 3


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_save_killed_midway_stays_reserved_until_the_service_abandons_it(
    training: Training, tmp_path: Path, project: str, catalog: Client, catalog_url: str, mode: str
) -> None:
    """A preempted job: SIGKILL while the upload writes. Step 2, committed, is where the
    next job resumes; step 3 is `writing` until its reservation lapses, then aborted."""
    root = training.service.tier_dir("hot") / project / "run-1"
    job = training.start(
        SCRIPT, "--project", project, "--run", "run-1", "--root", str(root),
        "--report", str(tmp_path / "report.json"), "--save-at", "2,3", "--hang-at", "3",
        "--mode", mode,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TRAIN_TIMEOUT
        while not (root / "step-3.hanging").exists():
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the save never started writing"
            time.sleep(0.1)
        # a later save's reservation travels beside its write: let it land (a job killed
        # before it did leaves step 3 uncatalogued, which is no worse)
        poll(
            "step 3 reserved",
            lambda: any(
                c.step == 3 and c.state == "writing"
                for c in catalog.run(project, "run-1").checkpoints()
            ),
        )
    finally:
        _kill(job, root / "step-3.hanging")

    run = catalog.find_run(project, "run-1")
    assert run is not None
    states = {c.step: c for c in run.checkpoints()}
    assert {step: c.state for step, c in states.items()} == {2: "active", 3: "writing"}
    latest = run.latest()
    assert latest is not None and latest.step == 2
    later = datetime.now(UTC) + timedelta(days=1)
    assert abandon_due(catalog_url, later) == [states[3].id]
    assert catalog.checkpoint(states[3].id).state in ("trashed", "deleted")


def test_two_ranks_save_one_checkpoint_that_rank_0_catalogues(
    training: Training, tmp_path: Path, project: str
) -> None:
    """Rank 1 has no run and no client; the manifest holds both ranks' files."""
    report = train(training, tmp_path, project, "--save-at", "2", "--world", "2")
    assert report["errors"] == []
    other = json.loads((tmp_path / "report-0.json.rank1").read_text())
    assert other["errors"] == []
    assert [s["checkpoint"] for s in other["saves"]] == [None]  # rank 1 commits nothing
    save = report["saves"][0]
    checkpoint = assert_committed(save, training.service, project)
    assert set(checkpoint["files"]) >= {".metadata", DATA_FILE}


def test_a_refused_reservation_fails_every_rank_before_anything_is_written(
    training: Training, tmp_path: Path, project: str, catalog: Client
) -> None:
    """Step 2 is already reserved as another class: rank 0's reservation is refused, and
    rank 1 learns it at once instead of waiting in the save's collectives."""
    root = training.service.tier_dir("hot") / project / "run-1"
    run = catalog.run(project, "run-1")
    run.reserve(2, root / "step-2", cls="milestone").abort("taken by the test")
    report = tmp_path / "report-0.json"
    done = subprocess.run(
        [
            str(training.python),
            str(SCRIPT),
            "--project",
            project,
            "--run",
            "run-1",
            "--root",
            str(root),
            "--report",
            str(report),
            "--save-at",
            "2",
            "--world",
            "2",
        ],
        env=training.env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT,
        check=False,
    )
    assert done.returncode != 0
    first = json.loads(report.read_text())["errors"]
    second = json.loads((tmp_path / "report-0.json.rank1").read_text())["errors"]
    assert [e["where"] for e in first] == ["save 2", "train"]
    assert "Conflict" in first[0]["error"]
    assert "rank 0 could not reserve step 2" in second[0]["error"]
    assert "Conflict" in second[0]["error"]
    assert not (root / "step-2").exists()
    assert [c.state for c in run.checkpoints()] in (["trashed"], ["deleted"])


def test_a_later_save_whose_reservation_is_refused_is_written_uncatalogued(
    training: Training, tmp_path: Path, project: str, catalog: Client
) -> None:
    """After the first save, reservations travel beside the writes: a refusal then cannot
    stop a write already under way, so it is logged and the training goes on."""
    root = training.service.tier_dir("hot") / project / "run-1"
    run = catalog.run(project, "run-1")
    taken = run.reserve(3, root / "step-3", cls="milestone").abort("taken by the test")
    assert taken is not None
    # its purge (the trash is kept 0 s here) must be over, or it would take the new bytes
    poll("the aborted step 3 purged", lambda: catalog.checkpoint(taken.id).state == "deleted")

    report = train(training, tmp_path, project, "--save-at", "2,3,4")

    assert report["errors"] == []
    by_step = {s["step"]: s for s in report["saves"]}
    assert by_step[3]["checkpoint"] is None and (root / "step-3" / ".metadata").is_file()
    for step in (2, 4):
        assert_committed(by_step[step], training.service, project)
    states = {c.step: (c.cls, c.state) for c in run.checkpoints()}
    assert states[3] == ("milestone", "deleted")
    assert (states[2][1], states[4][1]) == ("active", "active")


def test_a_training_outlives_an_outage_of_the_catalog(
    training: Training, tmp_path: Path, project: str, catalog: Client
) -> None:
    """The service goes away after the first save: the later ones are written all the
    same, their registrations spooled past the client's one-second deadline, and a flush
    once it is back catalogues them whole."""
    root = training.service.tier_dir("hot") / project / "run-1"
    report_path = tmp_path / "report.json"
    job = training.start(
        SCRIPT, "--project", project, "--run", "run-1", "--root", str(root),
        "--report", str(report_path), "--save-at", "2,4,6", "--hold-at", "3",
        "--deadline", "1", "--mode", "thread",
    )  # fmt: skip
    try:
        read_until(job, "AT 3")
        training.service.stop()
        try:
            started = time.monotonic()
            (tmp_path / "gate").touch()
            _, err = job.communicate(timeout=TRAIN_TIMEOUT)
            took = time.monotonic() - started
        finally:
            training.service.start()
    finally:
        kill(job)
    assert job.returncode == 0, err[-4000:]
    assert "spooled" in err
    assert took < 30, took  # two saves, each call held at most its deadline
    report = json.loads(report_path.read_text())
    assert report["errors"] == [] and [s["step"] for s in report["saves"]] == [2, 4, 6]
    assert all("error" not in s for s in report["saves"]), report["saves"]

    flushed = subprocess.run(
        [str(training.python), "-m", "ckpt_client", "flush"],
        env=training.env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert flushed.returncode == 0, flushed.stderr
    run = catalog.run(project, "run-1")
    states = {c.step: c.state for c in run.checkpoints()}
    assert states == {2: "active", 4: "active", 6: "active"}
    sizes = {c.step: c.size_bytes for c in run.checkpoints()}
    for step in (4, 6):  # registered whole, with the files on disk
        assert sizes[step] == sum(p.stat().st_size for p in (root / f"step-{step}").iterdir())


def _kill(job: subprocess.Popen[str], marker: Path) -> None:
    """SIGKILL the job, and the process that hangs in the write if it is another (DCP's
    checkpoint process, which outlives its parent)."""
    if job.poll() is None:
        job.kill()
    if marker.exists():
        writer = int(marker.read_text())
        if writer != job.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGKILL)
    job.communicate(timeout=60)  # the checkpoint process held the pipes too


def _id(run: Run, step: int) -> str:
    return next(c.id for c in run.checkpoints() if c.step == step)


def test_the_policy_alone_decides_which_saves_stay_on_disk(
    training: Training, tmp_path: Path, project: str, catalog_url: str
) -> None:
    """DCP writes every save and removes none; the service's keep_last 2 deletes the rest
    and its worker purges their directories."""
    root = training.service.tier_dir("hot") / project / "run-1"
    with training.service.admin() as admin:
        put_policy(
            admin,
            project,
            [{"name": "rolling-keep-2", "class": "rolling", "keep_last": 2, "action": "delete"}],
        )
        report = train(training, tmp_path, project, "--save-at", "2,4,6,8", "--mode", "thread")
        assert report["errors"] == []
        assert files(root) == {"step-2", "step-4", "step-6", "step-8"}
        run = run_of(admin, project)
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        poll(
            "steps 2 and 4 are purged",
            lambda: all(checkpoints(admin, run["id"])[s]["state"] == "deleted" for s in (2, 4)),
        )
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
        assert states == {2: "deleted", 4: "deleted", 6: "active", 8: "active"}
        assert files(root) == {"step-6", "step-8"}


def test_a_checkpoint_moved_to_cold_is_staged_back_onto_hot_to_resume(
    training: Training, tmp_path: Path, project: str, catalog_url: str
) -> None:
    first = train(training, tmp_path, project, "--save-at", "2,4", "--mode", "thread")
    assert first["errors"] == []
    root = training.service.tier_dir("hot") / project / "run-1"
    with training.service.admin() as admin:
        run = run_of(admin, project)
        ended = admin.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
        assert ended.status_code == 200, ended.text
        put_policy(
            admin,
            project,
            [{"name": "ended-cold", "when": {"run_ended": "0s"}, "action": {"move_to": "cold"}}],
        )
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        saved = checkpoints(admin, run["id"])
        assert {s: c["tier"] for s, c in saved.items()} == {2: "cold", 4: "cold"}
        assert files(root) == set()

        again = train(training, tmp_path, project, "--resume", "--save-at", "6", "--mode", "thread")
        four = admin.get(f"/v1/checkpoints/{saved[4]['id']}").json()
        hot = [loc for loc in four["locations"] if loc["tier"] == "hot"]
        assert four["tier"] == "cold" and [loc["role"] for loc in hot] == ["replica"]
        assert again["resumed_from"] == hot[0]["uri"].removeprefix("file://")
        assert again["loaded_step"] == 4
        assert again["loaded_weights"] == first["weights"]["4"]
