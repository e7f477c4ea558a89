"""The client's API against the real service: runs, registrations, reservations (commit),
listing, resume points, run ends and every error class."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_client import (
    Client,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Unauthorized,
    resume_path,
)
from tests.builders import remember_secret
from tests.client.conftest import ADMIN, Service
from tests.client.helpers import manifest_of, write_step


def hot(service: Service) -> Path:
    return service.tier_dir("hot")


# --- runs -----------------------------------------------------------------------------------


def test_run_is_created_then_reattached(client: Client, project: str) -> None:
    run = client.run(project, "run-1", labels={"team": "pretrain"})
    assert run.id and run.project == project and run.name == "run-1"
    assert run.status == "active" and run.labels == {"team": "pretrain"}
    assert run.started_at is not None and run.ended_at is None

    again = client.run(project, "run-1", labels={"team": "other"})  # a restarted job

    assert again.id == run.id
    assert again.labels == {"team": "pretrain"}  # the service keeps the run as it is
    assert client.get_run(run.id).name == "run-1"
    found = client.find_run(project, "run-1")
    assert found is not None and found.id == run.id
    assert client.find_run(project, "no-such-run") is None


def test_a_run_names_the_checkpoint_it_resumed_from(
    client: Client, service: Service, project: str
) -> None:
    first = client.run(project, "first")
    ckpt = first.register(10, write_step(hot(service), project, "first", 10))
    assert ckpt is not None

    second = client.run(project, "second", resumed_from=ckpt, policy=None)

    assert second.resumed_from == ckpt.id


def test_run_complete_and_fail_set_status_and_end(client: Client, project: str) -> None:
    done = client.run(project, "done")
    done.complete()
    assert done.status == "completed" and done.ended_at is not None
    assert client.get_run(done.id).status == "completed"

    failed = client.run(project, "failed")
    ended = datetime.now(UTC) + timedelta(seconds=1)
    failed.fail(ended_at=ended)

    assert failed.refresh().status == "failed"
    assert failed.ended_at is not None
    assert abs((failed.ended_at - ended).total_seconds()) < 0.001


# --- registrations ----------------------------------------------------------------------------


def test_register_returns_the_checkpoint(client: Client, service: Service, project: str) -> None:
    run = client.run(project, "run-1")
    root = write_step(hot(service), project, "run-1", 1000)

    ckpt = run.register(1000, f"file://{root}", metrics={"eval_loss": 2.31}, labels={"k": "v"})

    assert ckpt is not None
    assert (ckpt.run_id, ckpt.step, ckpt.cls, ckpt.state) == (run.id, 1000, "rolling", "active")
    assert ckpt.tier == "hot" and ckpt.uri == f"file://{root}"
    assert [(loc.tier, loc.role) for loc in ckpt.locations] == [("hot", "primary")]
    assert ckpt.metrics == {"eval_loss": 2.31} and ckpt.labels == {"k": "v"}
    assert ckpt.pinned is False
    assert ckpt.size_bytes == sum(f["size_bytes"] for f in manifest_of(root))
    assert ckpt.local_path == root
    assert client.checkpoint(ckpt.id) == ckpt


def test_register_takes_a_path_a_manifest_and_a_time(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = write_step(hot(service), project, "run-1", 5)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    ckpt = run.register(5, root, cls="milestone", files=manifest_of(root), created_at=when)

    assert ckpt is not None and ckpt.cls == "milestone" and ckpt.local_path == root
    assert ckpt.created_at == when
    assert ckpt.files is not None and len(ckpt.files) == 2


def test_the_same_registration_again_is_the_same_checkpoint(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = write_step(hot(service), project, "run-1", 7)
    first = run.register(7, root)
    again = run.register(7, root)
    assert first is not None and again is not None and again.id == first.id
    assert [c.step for c in run.checkpoints()] == [7]


def test_other_content_for_a_step_is_a_conflict_with_the_problem(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = write_step(hot(service), project, "run-1", 7)
    run.register(7, root)

    with pytest.raises(Conflict) as refused:
        run.register(7, root, cls="milestone")

    error = refused.value
    assert error.status == 409
    assert error.problem["status"] == 409 and error.problem["field"] == "step"
    assert "already registered" in error.problem["detail"]
    assert error.field == "step"
    assert "409" in str(error) and f"/v1/runs/{run.id}/checkpoints" in str(error)


def test_a_uri_under_no_tier_is_invalid(client: Client, project: str, tmp_path: Path) -> None:
    run = client.run(project, "run-1")
    with pytest.raises(Invalid) as refused:
        run.register(1, tmp_path)
    assert refused.value.status == 422 and refused.value.field == "uri"


def test_an_unknown_id_is_not_found(client: Client) -> None:
    with pytest.raises(NotFound) as refused:
        client.checkpoint("ckpt_nothing")
    assert refused.value.status == 404
    with pytest.raises(NotFound):
        client.get_run("run_nothing/../x")  # an id stays one path segment


def test_tokens_unknown_missing_and_short_of_scope(service: Service, project: str) -> None:
    with Client(service.url, token="not-a-token-of-this-service") as stranger:
        with pytest.raises(Unauthorized) as refused:
            stranger.run(project, "run-1")
        assert refused.value.status == 401
    with Client(service.url, token="") as anonymous, pytest.raises(Unauthorized):
        anonymous.tiers()
    with service.admin() as admin:
        made = admin.post(
            "/v1/tokens", json={"name": "reader", "scopes": ["read"], "projects": [project]}
        )
    assert made.status_code == 201, made.text
    reader_secret = remember_secret(made.json()["token"])
    with Client(service.url, token=reader_secret) as reader:
        with pytest.raises(Forbidden) as refused_scope:
            reader.run(project, "run-1")
        assert refused_scope.value.status == 403
        assert reader_secret not in repr(reader)


def test_the_token_is_in_no_repr(service: Service) -> None:
    with Client(service.url, token=ADMIN) as catalog:
        assert ADMIN not in repr(catalog) and "<token>" in repr(catalog)
        assert ADMIN not in repr(catalog.run("p-repr", "run-1"))


def test_tiers_are_listed_hottest_first(client: Client, service: Service) -> None:
    tiers = client.tiers()
    assert [t.name for t in tiers] == ["hot", "warm", "cold", "archive"]
    assert tiers[0].local_path == hot(service).resolve()
    assert tiers[0].uri_for("p", "r", 3) == f"file://{hot(service).resolve()}/p/r/step-3"


# --- reservations: reserve and commit (abort and keepalive: test_reservations_server.py) ------


def test_a_clean_exit_commits_with_the_metrics(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    root = hot(service) / project / "run-1" / "step-2000"

    with run.reserve(2000, root, cls="milestone") as pending:
        assert pending.checkpoint is not None and pending.checkpoint.state == "writing"
        assert [c.state for c in run.checkpoints()] == ["writing"]
        write_step(hot(service), project, "run-1", 2000)  # the framework writes the bytes
        pending.metrics["eval_loss"] = 2.1

    assert pending.checkpoint is not None
    assert pending.checkpoint.state == "active" and pending.checkpoint.cls == "milestone"
    assert pending.checkpoint.metrics == {"eval_loss": 2.1}
    assert pending.checkpoint.size_bytes == sum(f["size_bytes"] for f in manifest_of(root))
    assert client.checkpoint(pending.checkpoint.id).state == "active"


def test_an_explicit_commit_takes_the_manifest(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    reservation = run.reserve(3000, hot(service) / project / "run-1" / "step-3000")
    root = write_step(hot(service), project, "run-1", 3000)

    committed = reservation.commit(files=manifest_of(root), metrics={"loss": 1.0})

    assert committed is not None and committed.state == "active"
    assert committed.metrics == {"loss": 1.0} and committed.files is not None
    assert reservation.commit() == committed  # once closed, the same answer
    assert reservation.closed


# --- listing and resuming ---------------------------------------------------------------------


def test_checkpoints_follow_the_cursor_and_filter(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    for step in range(1, 8):
        cls = "milestone" if step % 3 == 0 else "rolling"
        run.register(step, write_step(hot(service), project, "run-1", step), cls=cls)
    client.page_size = 2

    assert [c.step for c in run.checkpoints()] == [7, 6, 5, 4, 3, 2, 1]
    assert [c.step for c in run.checkpoints(cls="milestone")] == [6, 3]
    assert [c.step for c in run.checkpoints(state="active", cls="rolling")] == [7, 5, 4, 2, 1]
    assert list(run.checkpoints(state="trashed")) == []


def test_resume_point_is_the_newest_active_checkpoint(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    assert run.resume_point() is None
    assert run.resume_point(stage_to="hot") is None
    for step in (10, 20):
        run.register(step, write_step(hot(service), project, "run-1", step))
    run.reserve(30, hot(service) / project / "run-1" / "step-30")  # writing: not a resume point

    point = run.resume_point(stage_to="hot")  # already on hot: nothing to stage

    assert point is not None and point.step == 20 and point.tier == "hot"
    with service.admin() as admin:
        actions = admin.get("/v1/actions", params={"run_id": run.id}).json()["items"]
    assert actions == []


def test_resume_point_stages_a_checkpoint_from_a_colder_tier(
    service: Service, spool_dir: Path, project: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir) as client:
        run = client.run(project, "run-1")
        cold_root = write_step(service.tier_dir("cold"), project, "run-1", 40)
        run.register(40, cold_root, files=manifest_of(cold_root))
        caplog.set_level(logging.INFO, logger="ckpt_client")

        point = run.resume_point(stage_to="hot", timeout=60)

    assert point is not None and point.step == 40
    staged = point.location("hot")
    assert staged is not None and staged.role == "replica" and point.tier == "cold"
    assert staged.local_path is not None
    copied = {
        p.relative_to(staged.local_path).as_posix(): p.read_bytes()
        for p in staged.local_path.rglob("*")
        if p.is_file()
    }
    original = {
        p.relative_to(cold_root).as_posix(): p.read_bytes()
        for p in cold_root.rglob("*")
        if p.is_file()
    }
    assert copied == original
    lines = [r.getMessage() for r in caplog.records if r.name == "ckpt_client"]
    assert any(line.startswith("staging step 40") for line in lines), lines
    assert any("is on hot" in line for line in lines), lines
    polls = [line for line in lines if line.startswith("waiting for step 40")]
    assert all("restore act" in line for line in polls), polls


def test_resume_path_gives_the_staged_local_path(
    service: Service, spool_dir: Path, project: str
) -> None:
    with Client(service.url, token=ADMIN, spool_dir=spool_dir) as client:
        run = client.run(project, "run-1")
        cold_root = write_step(service.tier_dir("cold"), project, "run-1", 50)
        run.register(50, cold_root)

        path = resume_path(project, "run-1", client=client, timeout=60)
        assert resume_path(project, "no-such-run", client=client) is None
        unstaged = resume_path(project, "run-1", stage_to=None, client=client)

    assert isinstance(path, Path) and path.is_dir()
    assert path.is_relative_to(hot(service).resolve())
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in cold_root.iterdir())
    assert unstaged == cold_root


def test_resume_path_reads_the_environment(
    service: Service, project: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CKPT_URL", service.url)
    monkeypatch.setenv("CKPT_TOKEN", ADMIN)
    monkeypatch.setenv("CKPT_SPOOL_DIR", str(tmp_path / "env-spool"))
    with Client() as client:
        assert client.url == service.url
        assert client.spool.directory == tmp_path / "env-spool"
        run = client.run(project, "run-1")
        run.register(1, write_step(hot(service), project, "run-1", 1))
    assert resume_path(project, "run-1") == hot(service) / project / "run-1" / "step-1"


def test_plain_http_sees_what_the_client_wrote(
    client: Client, service: Service, project: str
) -> None:
    """The client's calls are the documented API, nothing else."""
    run = client.run(project, "run-1", labels={"a": "b"})
    run.register(1, write_step(hot(service), project, "run-1", 1), metrics={"m": 1.5})
    with service.admin() as admin:
        listed = admin.get(f"/v1/runs/{run.id}/checkpoints").json()["items"]
        runs = admin.get("/v1/runs", params={"project": project}).json()["items"]
    assert [(c["step"], c["class"], c["metrics"]) for c in listed] == [(1, "rolling", {"m": 1.5})]
    assert [(r["name"], r["labels"]) for r in runs] == [("run-1", {"a": "b"})]


def test_restore_asks_then_waits_and_call_reaches_any_endpoint(
    client: Client, service: Service, project: str
) -> None:
    run = client.run(project, "run-1")
    ckpt = run.register(60, write_step(hot(service), project, "run-1", 60))
    assert ckpt is not None

    asked = client.restore(ckpt.id, "warm", wait=False)
    staged = client.restore(ckpt.id, "warm", timeout=60)  # the same action, waited for

    assert asked.location("warm") is None
    warm = staged.location("warm")
    assert warm is not None and warm.role == "replica" and staged.tier == "hot"
    assert client.restore(ckpt.id, "warm") == staged  # there already: nothing asked
    actions = client.call("GET", "/v1/actions", params={"checkpoint_id": ckpt.id})["items"]
    assert [(a["kind"], a["to_tier"], a["state"]) for a in actions] == [("restore", "warm", "done")]
    latest = run.latest()
    assert latest is not None and latest.id == ckpt.id
