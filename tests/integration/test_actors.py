"""Every catalog, policy and ledger change records who made it: a token (by id and name),
the rule that planned it, or the scheduler."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from app.db.models import Sweep
from app.main import NO_BACKGROUND, create_app
from app.scheduler.runtime import Runtime
from app.settings import Settings
from tests.builders import (
    file_entries,
    issue_token,
    make_executor,
    place_checkpoint,
    step_dir,
    step_files,
    token_client,
    write_checkpoint,
)

POLICY = {
    "name": "thin",
    "rules": [{"name": "keep-1", "class": "rolling", "keep_last": 1, "action": "delete"}],
}
RULE_ACTOR = "rule:thin/keep-1"


def actor_of(app: FastAPI, name: str, scopes: tuple[str, ...], *projects: str) -> tuple[str, Any]:
    token_id, secret = issue_token(app, name=name, scopes=scopes, projects=projects or None)
    return f"token:{token_id}:{name}", token_client(app, secret)


def sweep_actors(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as connection:
        return dict(connection.execute(select(Sweep.trigger, Sweep.actor)).tuples().all())


def test_a_training_job_s_token_is_recorded_on_its_runs_and_checkpoints(
    auth_app: FastAPI, auth_client: TestClient, data_dir: Path
) -> None:
    actor, job = actor_of(auth_app, "trainer", ("register",), "llama")
    run = job.post("/v1/runs", json={"project": "llama", "name": "run-1"}).json()
    assert run["created_by"] == run["updated_by"] == actor
    checkpoint = place_checkpoint(job, data_dir, run, 100)
    assert checkpoint["created_by"] == checkpoint["updated_by"] == actor
    stored = job.get(f"/v1/checkpoints/{checkpoint['id']}").json()  # what the database holds
    assert stored["created_by"] == stored["updated_by"] == actor
    files = step_files(200)
    root = step_dir(data_dir, "hot", run, 200)
    uri = write_checkpoint(root.parent, root.name, files)
    reserved = job.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={"step": 200, "class": "rolling", "uri": uri, "committed": False},
    ).json()
    _, other_job = actor_of(auth_app, "trainer-2", ("register",), "llama")
    committed = other_job.post(
        f"/v1/checkpoints/{reserved['id']}/commit", json={"files": file_entries(files)}
    ).json()
    assert committed["created_by"] == actor
    assert committed["updated_by"].endswith(":trainer-2")
    ended = other_job.patch(f"/v1/runs/{run['id']}", json={"status": "completed"}).json()
    assert ended["created_by"] == actor and ended["updated_by"].endswith(":trainer-2")


def test_admin_changes_record_the_admin_token(
    auth_app: FastAPI, auth_client: TestClient, data_dir: Path
) -> None:
    actor, admin = actor_of(auth_app, "ops", ("admin",))
    policy = admin.put("/v1/policies/thin", json=POLICY).json()
    assert policy["updated_by"] == actor
    run = admin.post("/v1/runs", json={"project": "p", "name": "r"}).json()
    checkpoint = place_checkpoint(admin, data_dir, run, 1)
    _, pinner = actor_of(auth_app, "pinner", ("admin",))
    pinned = pinner.post(f"/v1/checkpoints/{checkpoint['id']}/pin", json={"reason": "paper"})
    assert pinned.json()["updated_by"].endswith(":pinner")
    unpinned = admin.delete(f"/v1/checkpoints/{checkpoint['id']}/pin").json()
    assert unpinned["updated_by"] == actor
    restore = admin.post(f"/v1/checkpoints/{checkpoint['id']}/restore", json={"tier": "warm"})
    assert restore.json()["actor"] == actor
    delete = admin.delete(f"/v1/checkpoints/{checkpoint['id']}").json()
    assert delete["actor"] == actor and delete["rule"] == "manual"
    make_executor(auth_app, trash_retention=timedelta(0)).drain()
    trashed = admin.get(f"/v1/checkpoints/{checkpoint['id']}").json()
    assert trashed["state"] == "deleted"
    assert trashed["updated_by"] == actor  # the worker acted for whoever asked
    purge = admin.get("/v1/actions", params={"kind": "purge"}).json()["items"]
    assert [a["actor"] for a in purge] == [actor]


def test_policy_actions_record_their_rule_and_the_sweep_its_starter(
    auth_app: FastAPI, auth_client: TestClient, clean_engine: Engine, data_dir: Path
) -> None:
    actor, admin = actor_of(auth_app, "ops", ("admin",))
    admin.put("/v1/policies/thin", json=POLICY)
    run = admin.post("/v1/runs", json={"project": "p", "name": "r"}).json()
    checkpoints = [place_checkpoint(admin, data_dir, run, s) for s in (1, 2, 3)]
    sweep = admin.post("/v1/sweeps", json={}).json()
    assert sweep_actors(clean_engine) == {"manual": actor}
    actions = admin.get("/v1/actions").json()["items"]
    assert len(actions) == 2 and {a["state"] for a in actions} == {"held"}  # blast radius
    assert {a["actor"] for a in actions} == {RULE_ACTOR}
    first, second = actions
    _, approver = actor_of(auth_app, "approver", ("admin",))
    assert (
        approver.post(f"/v1/actions/{first['id']}/approve")
        .json()["approved_by"]
        .endswith(":approver")
    )
    assert admin.post(f"/v1/sweeps/{sweep['id']}/approve").json()["actions"] == [second["id"]]
    approved = {a["id"]: a for a in admin.get("/v1/actions").json()["items"]}
    assert approved[second["id"]]["approved_by"] == actor
    make_executor(auth_app).drain()
    for checkpoint in checkpoints[:2]:
        trashed = admin.get(f"/v1/checkpoints/{checkpoint['id']}").json()
        assert trashed["state"] == "trashed"
        assert trashed["updated_by"] == RULE_ACTOR
    undeleted = admin.post(f"/v1/checkpoints/{checkpoints[0]['id']}/undelete").json()
    assert undeleted["updated_by"] == actor


def test_the_scheduler_acts_as_a_named_system_actor(
    settings: Settings, clean_engine: Engine, data_dir: Path
) -> None:
    app = create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)
    with TestClient(app) as client:
        client.put("/v1/policies/thin", json=POLICY)
        run = client.post("/v1/runs", json={"project": "p", "name": "r"}).json()
        for step in (1, 2, 3, 4):
            place_checkpoint(client, data_dir, run, step)
        runtime = Runtime(
            app.state.session_factory,
            app.state.tiers,
            sweep_interval=timedelta(minutes=5),
            trash_retention=timedelta(days=7),
            worker=False,
            scheduler=False,
            evaluator=True,
        )
        runtime.start()
        try:
            assert runtime.wait_idle()  # the registrations asked for an evaluation
        finally:
            runtime.stop()
        runtime.sweep()
        actors = sweep_actors(clean_engine)
        assert actors["registration"] == "system:scheduler"
        assert actors["schedule"] == "system:scheduler"
        actions = client.get("/v1/actions").json()["items"]
        assert actions and {a["actor"] for a in actions} == {RULE_ACTOR}


def test_policy_files_are_recorded_as_loaded_from_files(
    settings: Settings, clean_engine: Engine
) -> None:
    settings.policies_dir.mkdir(parents=True, exist_ok=True)
    (settings.policies_dir / "thin.yaml").write_text(
        "name: thin\nrules:\n  - {name: keep-1, class: rolling, keep_last: 1, action: delete}\n"
    )
    with TestClient(create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)) as client:
        assert client.get("/v1/policies/thin").json()["updated_by"] == "system:policy-files"


@pytest.mark.parametrize("route", ["/v1/runs", "/v1/actions"])
def test_anonymous_changes_with_auth_off(client: TestClient, route: str) -> None:
    run = client.post("/v1/runs", json={"project": "quick", "name": "start"}).json()
    assert run["created_by"] == "anonymous"
    assert client.get(route).status_code == 200
