"""`ckpt_client.orbax.CatalogCheckpointManager` with the real orbax and JAX on the CPU against
a real `ckpt serve` (tests/frameworks/scripts/orbax_train.py): the policy alone decides
what stays on disk, a save killed before its rename into place is never `active`, a killed
training resumes from the newest committed step (also from a copy staged back from
`cold`), and an outage of the catalog costs the training nothing."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from ckpt_client import Client
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
)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "orbax_train.py"
TMP_MARK = ".orbax-checkpoint-tmp"  # ckpt_client.orbax.TMP_MARK (orbax is not installed here)
KEEP_2 = [{"name": "rolling-keep-2", "class": "rolling", "keep_last": 2, "action": "delete"}]


def argv(root: Path, project: str, *more: str) -> list[str]:
    return ["--project", project, "--run", "run-1", "--root", str(root), *more]


def saved_sums(lines: list[str]) -> dict[int, str]:
    """`SAVED <step> <checksum>` lines, by step."""
    return {int(p[1]): p[2] for p in (line.split() for line in lines) if p[0] == "SAVED"}


def sweep_and_settle(admin: httpx.Client, project: str, run_id: str) -> None:
    """A sweep, then the run's actions run to their end. (Only the run's: another test's
    project may have actions held meanwhile, by a periodic sweep of the scheduler after
    its run ended, which the module's service keeps open.)"""
    answer = admin.post("/v1/sweeps", json={"project": project})
    assert answer.status_code == 202, answer.text

    def settled() -> bool:
        actions = admin.get("/v1/actions", params={"limit": 500}).json()["items"]
        mine = [a for a in actions if a["run_id"] == run_id]
        return all(a["state"] in ("done", "failed", "cancelled") for a in mine)

    poll("the sweep's actions are done", settled)


def on_disk(root: Path) -> set[str]:
    """The step directories (orbax's own names and staged copies), not its metadata."""
    return {name for name in files(root) if name[-1].isdigit()}


def test_the_policy_alone_decides_which_saves_stay_on_disk(
    training: Training, project: str, catalog_url: str
) -> None:
    """orbax is told max_to_keep=1 and deletes nothing all the same; the service's
    keep_last 3 deletes the rest and its worker purges their directories. (Five saves, so
    that the two deletes stay under the service's blast radius, half of the project's
    checkpoints by count and by bytes: the saves' sizes differ by a few bytes.)"""
    root = training.service.tier_dir("hot") / project / "run-1"
    keep_3 = [{"name": "rolling-keep-3", "class": "rolling", "keep_last": 3, "action": "delete"}]
    with training.service.admin() as admin:
        put_policy(admin, project, keep_3)
        done = training.run(SCRIPT, *argv(root, project, "--steps", "10", "--max-to-keep", "1"))
        assert "DONE 10" in done.stdout
        assert "max_to_keep=1 / preservation_policy=None ignored" in done.stderr
        assert on_disk(root) == {"2", "4", "6", "8", "10"}
        run = run_of(admin, project)
        assert run["status"] == "completed"
        saved = checkpoints(admin, run["id"])
        assert {s: c["state"] for s, c in saved.items()} == {s: "active" for s in (2, 4, 6, 8, 10)}
        for step, checkpoint in saved.items():
            assert checkpoint["uri"] == f"file://{root / str(step)}"
            assert checkpoint["metrics"] == {"loss": 1.0 / step}
            assert checkpoint["size_bytes"] > 0
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project, run["id"])
        poll(
            "steps 2 and 4 are purged",
            lambda: all(checkpoints(admin, run["id"])[s]["state"] == "deleted" for s in (2, 4)),
        )
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
        assert states == {2: "deleted", 4: "deleted", 6: "active", 8: "active", 10: "active"}
        assert on_disk(root) == {"6", "8", "10"}


def test_synchronous_saves_are_committed_too_under_a_run_attached_beforehand(
    training: Training, project: str
) -> None:
    root = training.service.tier_dir("hot") / project / "run-1"
    done = training.run(SCRIPT, *argv(root, project, "--steps", "4", "--sync", "--attached"))
    assert "DONE 4" in done.stdout
    with training.service.admin() as admin:
        saved = checkpoints(admin, run_of(admin, project)["id"])
    assert {s: c["state"] for s, c in saved.items()} == {2: "active", 4: "active"}


def test_a_save_killed_before_its_rename_stays_reserved_until_the_service_aborts_it(
    training: Training, project: str, catalog_url: str
) -> None:
    """Step 4 is written and finalized but still `4.orbax-checkpoint-tmp-*` (blocked in
    orbax's post-finalization callback) when the job is SIGKILLed: `writing` until its
    reservation lapses, then aborted; never `active`, its temporary directory never
    registered."""
    root = training.service.tier_dir("hot") / project / "run-1"
    job = training.start(SCRIPT, *argv(root, project, "--steps", "8", "--block-at", "4"))
    try:
        read_until(job, "BLOCKED 4")
        with training.service.admin() as admin:
            run = run_of(admin, project)

            def reserved() -> dict[int, dict[str, Any]] | None:
                saved = checkpoints(admin, run["id"])
                two, four = saved.get(2), saved.get(4)
                ready = two and two["state"] == "active" and four and four["state"] == "writing"
                return saved if ready else None

            saved = poll("step 4 is reserved", reserved)
            assert job.poll() is None
            names = files(root)
            assert "4" not in names and any(n.startswith(f"4{TMP_MARK}") for n in names), names
    finally:
        kill(job)
    assert saved[4]["uri"] == f"file://{root / '4'}"
    with training.service.admin() as admin:
        after = checkpoints(admin, run["id"])
    assert {s: c["state"] for s, c in after.items()} == {2: "active", 4: "writing"}
    assert all(TMP_MARK not in c["uri"] for c in after.values())
    later = datetime.now(UTC) + timedelta(days=1)
    assert abandon_due(catalog_url, later) == [saved[4]["id"]]
    with training.service.admin() as admin:
        states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
    assert states[2] == "active" and states[4] in ("trashed", "deleted")


def test_an_orbax_whose_finalize_hook_changed_is_refused_at_import(training: Training) -> None:
    """The one private method the manager overrides: another signature fails loudly."""
    probe = (
        "import orbax.checkpoint as ocp\n"
        "ocp.CheckpointManager._finalize = lambda self, step: None\n"
        "import ckpt_client.orbax\n"
    )
    done = subprocess.run(
        [str(training.python), "-c", probe],
        env=training.env(),
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT,
        check=False,
    )
    assert done.returncode != 0
    assert "ImportError: ckpt_client.orbax commits a save after orbax renames it" in done.stderr
    assert "('self', 'step')" in done.stderr


def test_a_failed_save_aborts_its_reservation(training: Training, project: str) -> None:
    """Step 4's save fails in orbax's background thread: its reservation is aborted with
    the error, the saves around it are committed, and the training goes on."""
    root = training.service.tier_dir("hot") / project / "run-1"
    done = training.run(SCRIPT, *argv(root, project, "--steps", "6", "--fail-at", "4"))
    assert "FAILED 4 [Errno 28] No space left on device (injected at step 4)" in done.stdout
    assert "DONE 6" in done.stdout
    assert "4" not in on_disk(root)
    with training.service.admin() as admin:
        run = run_of(admin, project)
        saved = checkpoints(admin, run["id"])
        assert saved[2]["state"] == "active" and saved[6]["state"] == "active"
        assert saved[4]["state"] in ("trashed", "deleted")
        audit = admin.get("/v1/audit", params={"checkpoint_id": saved[4]["id"]}).json()
    aborted = [e for e in audit["items"] if e.get("event") == "aborted"]
    assert aborted and "No space left on device" in str(aborted[0]), audit


def test_a_killed_training_resumes_from_its_newest_committed_step(
    training: Training, project: str, catalog_url: str, tmp_path: Path
) -> None:
    root = training.service.tier_dir("hot") / project / "run-1"
    first = training.start(
        SCRIPT, *argv(root, project, "--steps", "12", "--hold-at", "7", "--gate", "no-such")
    )
    try:
        before = saved_sums(read_until(first, "AT 7"))
    finally:
        kill(first)
    gate = tmp_path / "gate"
    again = training.start(
        SCRIPT,
        *argv(root, project, "--steps", "12", "--resume", "--hold-at", "11", "--gate", str(gate)),
    )
    try:
        lines = read_until(again, "AT 11")
        assert "CATALOG 6 ORBAX 6" in lines
        assert f"RESUME {root / '6'}" in lines
        assert f"START 6 {before[6]}" in lines
        with training.service.admin() as admin:
            run = run_of(admin, project)
            saved = checkpoints(admin, run["id"])
            assert sorted(saved) == [2, 4, 6, 8, 10]
            poll(
                "the run names step 6 as resumed_from",
                lambda: run_of(admin, project)["resumed_from"] == saved[6]["id"],
            )
            put_policy(admin, project, KEEP_2)
            back_date(catalog_url, run["id"])
            for _ in range(2):  # every later sweep
                sweep_and_settle(admin, project, run["id"])
            poll("step 2 is purged", lambda: checkpoints(admin, run["id"])[2]["state"] == "deleted")
            states = {s: c["state"] for s, c in checkpoints(admin, run["id"]).items()}
            # 6, third newest: kept only because the running job resumed from it
            assert states == {2: "deleted", 4: "deleted", 6: "active", 8: "active", 10: "active"}
            assert on_disk(root) == {"6", "8", "10"}
        gate.touch()
        out, err = again.communicate(timeout=TRAIN_TIMEOUT)
        assert again.returncode == 0, err[-4000:]
        assert "DONE 12" in out
    finally:
        kill(again)
    with training.service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "completed"
        assert checkpoints(admin, run["id"])[12]["state"] == "active"


def test_a_checkpoint_moved_to_cold_is_staged_back_onto_hot_to_resume(
    training: Training, project: str, catalog_url: str
) -> None:
    root = training.service.tier_dir("hot") / project / "run-1"
    first = training.run(SCRIPT, *argv(root, project, "--steps", "4"))
    before = saved_sums(first.stdout.splitlines())
    with training.service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "completed"
        put_policy(
            admin,
            project,
            [{"name": "ended-cold", "when": {"run_ended": "0s"}, "action": {"move_to": "cold"}}],
        )
        back_date(catalog_url, run["id"])
        sweep_and_settle(admin, project, run["id"])
        saved = checkpoints(admin, run["id"])
        assert {s: c["tier"] for s, c in saved.items()} == {2: "cold", 4: "cold"}
        assert on_disk(root) == set()

        again = training.run(SCRIPT, *argv(root, project, "--steps", "6", "--resume"))
        four = admin.get(f"/v1/checkpoints/{saved[4]['id']}").json()
        hot = [loc for loc in four["locations"] if loc["tier"] == "hot"]
        assert four["tier"] == "cold" and [loc["role"] for loc in hot] == ["replica"]
        staged = hot[0]["uri"].removeprefix("file://")
        assert Path(staged).name == "step-4"  # the service's name, not orbax's
        # the catalog knows step 4, in cold; orbax's directory holds no step it can read
        assert "CATALOG 4 ORBAX None" in again.stdout
        assert f"RESUME {staged}" in again.stdout
        assert f"START 4 {before[4]}" in again.stdout
        assert "DONE 6" in again.stdout
        run = run_of(admin, project)
        assert run["resumed_from"] == saved[4]["id"] and run["status"] == "completed"
        assert checkpoints(admin, run["id"])[6]["state"] == "active"


def test_a_training_outlives_an_outage_of_the_catalog(
    training: Training, service: Service, project: str, tmp_path: Path
) -> None:
    """The service stops at step 3: saves 4 and 6 and the run's end are spooled, each
    after the one-second deadline, and the training never waits on them."""
    root = service.tier_dir("hot") / project / "run-1"
    gate = tmp_path / "gate"
    job = training.start(
        SCRIPT,
        *argv(root, project, "--steps", "6", "--hold-at", "3", "--gate", str(gate)),
        *("--deadline", "1"),
    )
    try:
        read_until(job, "AT 3")
        service.stop()
        try:
            gate.touch()
            released = time.monotonic()
            out, err = job.communicate(timeout=TRAIN_TIMEOUT)
            took = time.monotonic() - released
        finally:
            service.start()
    finally:
        kill(job)
    assert job.returncode == 0, err[-6000:]
    assert "DONE 6" in out
    assert took < 30, took
    assert err.count("spooled to") == 3, err[-6000:]  # two registrations and the run's end
    assert on_disk(root) == {"2", "4", "6"}
    with Client(service.url, token=ADMIN, spool_dir=training.spool_dir) as client:
        report = client.flush()
    assert (report.landed, report.refused) == (3, [])
    with service.admin() as admin:
        run = run_of(admin, project)
        assert run["status"] == "completed"
        saved = checkpoints(admin, run["id"])
    assert {s: c["state"] for s, c in saved.items()} == {2: "active", 4: "active", 6: "active"}
    assert all(c["size_bytes"] > 0 for c in saved.values())
