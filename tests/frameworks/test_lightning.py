"""`ckpt_client.lightning` with the real Lightning on the CPU against a real `ckpt serve`:
the policy alone decides what stays on disk, a save killed mid-write never becomes an
`active` checkpoint, and a killed training resumes from the newest committed step."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.client.conftest import Service
from tests.frameworks.conftest import Training, abandon_due
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

SCRIPT = Path(__file__).resolve().parent / "scripts" / "lightning_train.py"
GATE = "gate"  # the file that lets a held training go on (in its working directory)


def step_file(step: int, epoch: int = 0) -> str:
    return f"epoch={epoch}-step={step}.ckpt"


def test_the_policy_alone_decides_what_stays_on_disk(
    training: Training, service: Service, project: str, catalog_url: str
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    with service.admin() as admin:
        put_policy(
            admin,
            project,
            [{"name": "rolling-keep-2", "class": "rolling", "keep_last": 2, "action": "delete"}],
        )
        # save_top_k=1: Lightning would remove each save as the next one lands
        done = training.run(
            SCRIPT,
            project,
            "run-1",
            str(directory),
            "12",
            "2",
            "--milestone-every",
            "4",
            "--top-k",
            "1",
        )
        assert "ModelCheckpoint(save_top_k=1): set save_top_k=-1" in done.stderr
        written = {step_file(s) for s in (2, 4, 6, 8, 10, 12)}
        assert files(directory) == written  # Lightning removed nothing

        run = run_of(admin, project)
        assert run["status"] == "completed"
        saved = checkpoints(admin, run["id"])
        classes = {step: c["class"] for step, c in saved.items()}
        assert classes == {
            2: "rolling",
            4: "milestone",
            6: "rolling",
            8: "milestone",
            10: "rolling",
            12: "final",
        }
        assert {c["state"] for c in saved.values()} == {"active"}
        assert all("train_loss" in c["metrics"] for c in saved.values())
        assert all(c["uri"] == f"file://{directory / step_file(s)}" for s, c in saved.items())

        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        poll("step 2 is purged", lambda: checkpoints(admin, run["id"])[2]["state"] == "deleted")
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
        assert states == {
            2: "deleted",
            4: "active",
            6: "active",
            8: "active",
            10: "active",
            12: "active",
        }
        assert files(directory) == written - {step_file(2)}


def test_a_save_killed_mid_write_under_async_io_is_aborted_never_active(
    training: Training, service: Service, project: str, catalog_url: str
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    process = training.start(
        SCRIPT, project, "run-1", str(directory), "8", "2", "--async", "--stall-at", "4"
    )
    try:
        read_until(process, "SAVING 4")  # half of step 4 is on disk, its writer stalled
        with service.admin() as admin:
            run = run_of(admin, project)

            def reserved() -> dict[str, Any] | None:
                saved = checkpoints(admin, run["id"])
                two, four = saved.get(2), saved.get(4)
                ready = two is not None and two["state"] == "active" and four is not None
                return four if ready else None

            four = poll("step 2 committed, step 4 reserved", reserved)
            assert four["state"] == "writing" and four["reserved_until"] is not None
            # A policy that would take everything away finds nothing it may touch: the
            # reservation is invisible to it, step 2 is the running job's resume point.
            put_policy(
                admin,
                project,
                [{"name": "all-gone", "class": "rolling", "keep_last": 0, "action": "delete"}],
            )
            back_date(catalog_url, run["id"])
            sweep_and_settle(admin, project)
            saved = checkpoints(admin, run["id"])
            assert (saved[2]["state"], saved[4]["state"]) == ("active", "writing")
            assert (directory / step_file(4)).read_bytes() == b"half a checkpoint"
    finally:
        kill(process)  # preempted mid-write

    with service.admin() as admin:
        until = datetime.fromisoformat(four["reserved_until"].replace("Z", "+00:00"))
        assert abandon_due(catalog_url, now=until + timedelta(seconds=1)) == [four["id"]]
        saved = checkpoints(admin, run["id"])
        assert sorted(saved) == [2, 4]  # 6 and 8 waited behind the stalled write
        # aborted, never active: its half file goes with the trash (stamped at the clock
        # abandon_due was given, so its purge is not due within this test)
        assert saved[4]["state"] == "trashed"
        assert saved[2]["state"] == "active" and saved[2]["size_bytes"] > 0
        assert step_file(2) in files(directory)


def test_a_killed_training_resumes_from_its_newest_committed_step(
    training: Training, service: Service, project: str, catalog_url: str, tmp_path: Path
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    process = training.start(SCRIPT, project, "run-1", str(directory), "12", "2", "--hold-at", "7")
    try:
        read_until(process, "AT 7")
        with service.admin() as admin:  # the commits travel behind the saves: let 6's land
            run = run_of(admin, project)
            poll(
                "step 6 committed",
                lambda: checkpoints(admin, run["id"]).get(6, {}).get("state") == "active",
            )
    finally:
        kill(process)
    resumed = training.start(
        SCRIPT, project, "run-1", str(directory), "12", "2", "--resume", "--hold-at", "11"
    )
    try:
        lines = read_until(resumed, "AT 11")
        assert f"RESUME {directory / step_file(6)}" in lines and "START 6" in lines
        with service.admin() as admin:
            run = run_of(admin, project)
            poll(
                "step 10 committed",
                lambda: checkpoints(admin, run["id"]).get(10, {}).get("state") == "active",
            )
            saved = checkpoints(admin, run["id"])
            assert run["status"] == "active" and run["resumed_from"] == saved[6]["id"]
            assert sorted(saved) == [2, 4, 6, 8, 10]
            put_policy(
                admin,
                project,
                [
                    {
                        "name": "rolling-keep-2",
                        "class": "rolling",
                        "keep_last": 2,
                        "action": "delete",
                    }
                ],
            )
            back_date(catalog_url, run["id"])
            for _ in range(2):  # every later sweep
                sweep_and_settle(admin, project)
            poll("step 2 is purged", lambda: checkpoints(admin, run["id"])[2]["state"] == "deleted")
            states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
            # 6, third newest: kept only because the running job resumed from it
            assert states == {2: "deleted", 4: "deleted", 6: "active", 8: "active", 10: "active"}
            assert files(directory) == {step_file(s) for s in (6, 8, 10)}
        (tmp_path / GATE).touch()  # on to the end
        out, err = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, err[-4000:]
        assert "DONE 12" in out
    finally:
        kill(resumed)
    with service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "completed"
        assert checkpoints(admin, run["id"])[12]["class"] == "final"


def test_a_checkpoint_moved_to_cold_is_staged_back_onto_hot_to_resume(
    training: Training, service: Service, project: str, catalog_url: str
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    crashed = training.start(SCRIPT, project, "run-1", str(directory), "12", "2", "--fail-at", "7")
    assert crashed.wait(timeout=300) != 0
    with service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "failed"  # the fit's exception ended it
        put_policy(
            admin,
            project,
            [
                {
                    "name": "failed-cold",
                    "when": {"run_status": ["failed"]},
                    "action": {"move_to": "cold"},
                }
            ],
        )
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project)
        saved = checkpoints(admin, run["id"])
        assert {s: c["tier"] for s, c in saved.items()} == {2: "cold", 4: "cold", 6: "cold"}
        assert files(directory) == set()

        resumed = training.run(SCRIPT, project, "run-1", str(directory), "12", "2", "--resume")
        assert "START 6" in resumed.stdout and "DONE 12" in resumed.stdout
        six = admin.get(f"/v1/checkpoints/{saved[6]['id']}").json()
        hot = [loc for loc in six["locations"] if loc["tier"] == "hot"]
        assert six["tier"] == "cold" and len(hot) == 1 and hot[0]["role"] == "replica"
        assert f"RESUME {hot[0]['uri'].removeprefix('file://')}" in resumed.stdout
        run = run_of(admin, project)
        assert run["status"] == "completed" and run["resumed_from"] == six["id"]
        assert sorted(checkpoints(admin, run["id"])) == [2, 4, 6, 8, 10, 12]


def test_the_service_going_away_mid_fit_never_fails_the_training(
    training: Training, service: Service, project: str, tmp_path: Path
) -> None:
    directory = service.tier_dir("hot") / project / "run-1"
    process = training.start(
        SCRIPT, project, "run-1", str(directory), "6", "2", "--hold-at", "3", "--deadline", "2"
    )
    try:
        read_until(process, "AT 3")
        service.stop()  # an outage: steps 4 and 6 are saved while it lasts
        try:
            (tmp_path / GATE).touch()
            out, err = process.communicate(timeout=300)
        finally:
            service.start()
        assert process.returncode == 0, err[-4000:]
        assert "DONE 6" in out and "spooled" in err
    finally:
        kill(process)
    assert files(directory) == {step_file(s) for s in (2, 4, 6)}

    flushed = subprocess.run(
        [str(training.python), "-m", "ckpt_client", "flush"],
        env=training.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert flushed.returncode == 0, flushed.stderr
    with service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "completed"  # the spooled end, after the spooled saves
        saved = checkpoints(admin, run["id"])
        assert {s: c["state"] for s, c in saved.items()} == {2: "active", 4: "active", 6: "active"}
        assert all(c["size_bytes"] > 0 for c in saved.values())
