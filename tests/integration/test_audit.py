"""The audit trail (GET /v1/audit): every change of a checkpoint, run, policy, token and
action leaves one event, written in the change's own transaction, with who made it, what
changed and why (the rule of the action behind it)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select, update

from app.bootstrap import load_policies_into
from app.db.models import AuditEvent, Checkpoint
from app.db.session import session_scope
from app.services.catalog.checkpoints import set_pin
from app.settings import Settings
from tests.builders import (
    ago,
    assert_problem,
    end_run,
    iso,
    issue_token,
    list_all,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    remember_secret,
    step_dir,
    sweep_now,
    token_client,
)

POLICY = """\
name: tiering
rules:
  - name: keep-1
    class: rolling
    keep_last: 1
    action: delete
  - name: to-warm
    class: milestone
    when: {run_ended: 0s}
    action: {move_to: warm}
"""

Summary = tuple[str, str, str, str | None]  # entity, event, actor, reason


def trail(client: TestClient, **filters: Any) -> list[dict[str, Any]]:
    """Every event matching `filters`, all pages, oldest first."""
    items, _pages = list_all(client, "/v1/audit", 1000, **filters)
    return items


def summary(events: list[dict[str, Any]]) -> list[Summary]:
    return [(e["entity"], e["event"], e["actor"], e["reason"]) for e in events]


def count_events(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(AuditEvent)).scalar_one())


@pytest.fixture
def ops(auth_app: FastAPI, auth_client: TestClient) -> tuple[str, TestClient]:
    """An admin token (its actor, a client sending it); auth_client runs the lifespan."""
    token_id, secret = issue_token(auth_app, name="ops", scopes=("admin",))
    return f"token:{token_id}:ops", token_client(auth_app, secret)


def test_a_lifecycle_leaves_an_ordered_trail_with_actors_changes_and_rules(
    auth_app: FastAPI, ops: tuple[str, TestClient], data_dir: Path
) -> None:
    actor, client = ops
    put_policy(client, POLICY)
    run = make_run(client, "llm", "run-1")
    old = place_checkpoint(client, data_dir, run, 1)
    place_checkpoint(client, data_dir, run, 2)
    milestone = place_checkpoint(client, data_dir, run, 3, "milestone")
    cid = old["id"]

    assert client.post(f"/v1/checkpoints/{cid}/pin", json={"reason": "paper"}).status_code == 200
    assert client.delete(f"/v1/checkpoints/{cid}/pin").status_code == 200
    assert client.delete(f"/v1/checkpoints/{cid}").status_code == 202
    make_executor(auth_app).drain()  # a week of trash: no purge yet
    undeleted = client.post(f"/v1/checkpoints/{cid}/undelete")
    assert undeleted.status_code == 200
    until = datetime.fromisoformat(undeleted.json()["protected_until"])
    protected_until = f"{until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    with session_scope(auth_app.state.session_factory) as session:  # its protection is over
        session.execute(
            update(Checkpoint).where(Checkpoint.id == cid).values(protected_until=ago(seconds=1))
        )
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    sweep_now(client)
    make_executor(auth_app, trash_retention=timedelta(0)).drain()

    keep, warm = "rule:tiering/keep-1", "rule:tiering/to-warm"
    events = trail(client, checkpoint_id=cid)
    assert summary(events) == [
        ("checkpoint", "registered", actor, None),
        ("checkpoint", "pinned", actor, None),
        ("checkpoint", "unpinned", actor, None),
        ("action", "created", actor, "manual"),
        ("action", "claimed", actor, "manual"),
        ("checkpoint", "trashed", actor, "manual"),
        ("action", "done", actor, "manual"),
        ("checkpoint", "undeleted", actor, f"protected: undeleted until {protected_until}"),
        ("action", "created", keep, "tiering/keep-1"),
        ("action", "claimed", keep, "tiering/keep-1"),
        ("checkpoint", "trashed", keep, "tiering/keep-1"),
        ("action", "done", keep, "tiering/keep-1"),
        ("action", "created", keep, "tiering/keep-1"),  # the purge: whoever decided the delete
        ("action", "claimed", keep, "tiering/keep-1"),
        ("checkpoint", "purged", keep, "tiering/keep-1"),
        ("action", "done", keep, "tiering/keep-1"),
    ]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    assert all(e["checkpoint_id"] == cid and e["run_id"] == run["id"] for e in events)
    by_event = {(e["entity"], e["event"]): e for e in events}  # the last of each
    hot = {"tier": "hot", "role": "primary", "uri": old["uri"]}
    assert events[0]["after"] == {
        "state": "active",
        "step": 1,
        "class": "rolling",
        "size_bytes": old["size_bytes"],
        "tier": "hot",
        "locations": [hot],
    }
    assert events[0]["before"] is None
    assert (events[1]["before"], events[1]["after"]) == (
        {"pinned": False, "pin_reason": None},
        {"pinned": True, "pin_reason": "paper"},
    )
    assert events[2]["after"] == {"pinned": False, "pin_reason": None}
    assert events[3]["after"]["kind"] == "delete" and events[3]["after"]["state"] == "pending"
    assert events[3]["after"]["reason"] == "deleted by request"
    assert (events[5]["before"], events[5]["after"]) == ({"state": "active"}, {"state": "trashed"})
    assert (events[7]["before"], events[7]["after"]) == (
        {"state": "trashed"},
        {"state": "active", "protected_until": undeleted.json()["protected_until"]},
    )
    assert events[8]["after"]["sweep_id"]
    assert events[12]["after"]["kind"] == "purge"
    purged = by_event["checkpoint", "purged"]
    assert purged["before"] == {"state": "trashed", "tier": "hot", "locations": [hot]}
    assert purged["after"] == {"state": "deleted", "tier": None, "locations": []}
    assert by_event["action", "done"]["before"] == {"state": "running"}

    moves = trail(client, checkpoint_id=milestone["id"])
    assert summary(moves) == [
        ("checkpoint", "registered", actor, None),
        ("action", "created", warm, "tiering/to-warm"),
        ("action", "claimed", warm, "tiering/to-warm"),
        ("checkpoint", "moved", warm, "tiering/to-warm"),
        ("action", "done", warm, "tiering/to-warm"),
    ]
    moved = moves[3]
    warm_uri = f"file://{step_dir(data_dir, 'warm', run, 3).resolve()}"
    assert moved["before"] == {
        "tier": "hot",
        "locations": [{"tier": "hot", "role": "primary", "uri": milestone["uri"]}],
    }
    assert moved["after"] == {
        "tier": "warm",
        "locations": [{"tier": "warm", "role": "primary", "uri": warm_uri}],
    }

    run_events = trail(client, run_id=run["id"])
    assert summary(run_events[:1]) == [("run", "created", actor, None)]
    assert run_events[0]["after"]["status"] == "active"
    (ended,) = [e for e in run_events if e["entity"] == "run" and e["event"] == "updated"]
    assert ended["before"] == {"status": "active", "ended_at": None}
    assert ended["after"]["status"] == "completed" and ended["after"]["ended_at"]


def test_each_filter_selects_its_events_and_they_combine(
    auth_app: FastAPI, ops: tuple[str, TestClient], data_dir: Path
) -> None:
    actor, client = ops
    other_id, other_secret = issue_token(
        auth_app, name="trainer", scopes=("register",), projects=("a",)
    )
    trainer = token_client(auth_app, other_secret)
    first = client.post("/v1/runs", json={"project": "a", "name": "r"}).json()
    second = trainer.post("/v1/runs", json={"project": "a", "name": "s"}).json()
    one = place_checkpoint(client, data_dir, first, 1)
    two = place_checkpoint(trainer, data_dir, second, 1)
    client.post(f"/v1/checkpoints/{two['id']}/pin", json={"reason": "keep"})

    everything = trail(client)
    assert {e["run_id"] for e in trail(client, run_id=first["id"])} == {first["id"]}
    assert summary(trail(client, run_id=second["id"])) == [
        ("run", "created", f"token:{other_id}:trainer", None),
        ("checkpoint", "registered", f"token:{other_id}:trainer", None),
        ("checkpoint", "pinned", actor, None),
    ]
    assert [e["entity_id"] for e in trail(client, checkpoint_id=one["id"])] == [one["id"]]
    by_trainer = trail(client, actor=f"token:{other_id}:trainer")
    assert [e["event"] for e in by_trainer] == ["created", "registered"]
    assert [e for e in everything if e["actor"].startswith("token:")] == trail(
        client, actor="token:*"
    )
    assert trail(client, actor="token:") == []  # exact unless it ends in `*`
    assert [e["event"] for e in trail(client, checkpoint_id=two["id"], actor=actor)] == ["pinned"]
    assert trail(client, run_id=first["id"], checkpoint_id=two["id"]) == []
    assert trail(client, checkpoint_id="ckpt_nope") == []


def test_pages_neither_repeat_nor_skip(
    auth_app: FastAPI, ops: tuple[str, TestClient], data_dir: Path
) -> None:
    _actor, client = ops
    run = client.post("/v1/runs", json={"project": "p", "name": "r"}).json()
    for n in range(12):
        client.patch(f"/v1/runs/{run['id']}", json={"labels": {"n": str(n)}})
    everything = trail(client)
    assert len(everything) >= 13
    for limit in (1, 5, len(everything)):
        paged, pages = list_all(client, "/v1/audit", limit)
        assert paged == everything
        assert pages == -(-len(everything) // limit)
    # a page handed out before more events arrive continues where it stopped
    page = client.get("/v1/audit", params={"limit": 4}).json()
    client.patch(f"/v1/runs/{run['id']}", json={"labels": {"n": "last"}})
    rest, _pages = list_all(client, "/v1/audit", 4, cursor=page["next_cursor"])
    assert page["items"] + rest == trail(client)
    labels = [e for e in everything if e["event"] == "updated"]
    assert labels[0]["before"] == {"labels": {}} and labels[0]["after"] == {"labels": {"n": "0"}}
    assert labels[1]["before"] == {"labels": {"n": "0"}}


def test_since_filters_by_time_and_bad_values_are_refused(
    auth_app: FastAPI, ops: tuple[str, TestClient]
) -> None:
    _actor, client = ops
    client.post("/v1/runs", json={"project": "p", "name": "before"})
    boundary = datetime.now(UTC)
    late = client.post("/v1/runs", json={"project": "p", "name": "after"}).json()
    recent = trail(client, since=iso(boundary))
    assert [(e["entity_id"], e["event"]) for e in recent] == [(late["id"], "created")]
    as_offset = boundary.astimezone(UTC).replace(tzinfo=None).isoformat() + "+00:00"
    assert trail(client, since=as_offset) == recent
    assert trail(client, since=iso(datetime.now(UTC) + timedelta(minutes=1))) == []
    assert len(trail(client, since="2000-01-01T00:00:00Z")) == len(trail(client))
    assert_problem(client.get("/v1/audit", params={"since": "yesterday"}), 422, "since")
    assert_problem(client.get("/v1/audit", params={"cursor": "not-a-cursor"}), 400, "cursor")
    assert_problem(client.get("/v1/audit", params={"limit": 0}), 422, "limit")


def test_a_token_s_creation_and_revocation_are_audited_without_its_secret(
    auth_app: FastAPI, ops: tuple[str, TestClient]
) -> None:
    actor, client = ops
    response = client.post(
        "/v1/tokens", json={"name": "job", "scopes": ["register"], "projects": ["llm"]}
    )
    assert response.status_code == 201, response.text
    created = response.json()
    secret = remember_secret(created["token"])
    assert client.delete(f"/v1/tokens/{created['id']}").status_code == 204
    assert client.delete(f"/v1/tokens/{created['id']}").status_code == 204  # no second event

    events = [e for e in trail(client) if e["entity_id"] == created["id"]]
    assert summary(events) == [("token", "created", actor, None), ("token", "revoked", actor, None)]
    assert events[0]["after"] == {"name": "job", "scopes": ["register"], "projects": ["llm"]}
    assert events[1]["before"] == {"revoked_at": None} and events[1]["after"]["revoked_at"]
    text = json.dumps(trail(client))
    assert secret not in text
    assert hashlib.sha256(secret.encode()).hexdigest() not in text
    assert "secret" not in text
    ops_token = actor.split(":")[1]  # made straight in the database by the tests, as "test"
    assert [e["actor"] for e in trail(client) if e["entity_id"] == ops_token] == ["test"]


def test_policies_are_audited_only_when_their_document_changes(
    auth_app: FastAPI, ops: tuple[str, TestClient], auth_settings: Settings
) -> None:
    actor, client = ops
    put_policy(client, POLICY)
    put_policy(client, POLICY)  # the same document again: nothing changed
    changed = POLICY.replace("keep_last: 1", "keep_last: 2")
    put_policy(client, changed)
    assert client.delete("/v1/policies/tiering").status_code == 204

    events = trail(client, actor=actor)
    policy_events = [e for e in events if e["entity"] == "policy"]
    assert summary(policy_events) == [
        ("policy", "created", actor, None),
        ("policy", "updated", actor, None),
        ("policy", "deleted", actor, None),
    ]
    assert all(e["entity_id"] == "tiering" for e in policy_events)
    created, updated, deleted = policy_events
    assert created["after"]["source"] == "api"
    assert created["after"]["document"]["rules"][0]["keep_last"] == 1
    assert updated["before"]["document"]["rules"][0]["keep_last"] == 1
    assert updated["after"]["document"]["rules"][0]["keep_last"] == 2
    assert deleted["before"]["document"] == updated["after"]["document"]
    assert deleted["after"] is None

    # from the policy files: audited when loaded, not when loaded again unchanged
    auth_settings.policies_dir.mkdir(parents=True, exist_ok=True)
    (auth_settings.policies_dir / "files.yaml").write_text(POLICY.replace("tiering", "files"))
    for _ in range(2):
        load_policies_into(auth_app.state.session_factory, auth_settings, auth_app.state.tiers)
    loaded = trail(client, actor="system:policy-files")
    assert [(e["entity_id"], e["event"]) for e in loaded] == [("files", "created")]
    assert loaded[0]["after"]["source"].endswith("files.yaml")


def test_approvals_cancellations_and_retries_are_audited(
    auth_app: FastAPI, ops: tuple[str, TestClient], data_dir: Path
) -> None:
    actor, client = ops
    put_policy(client, POLICY)
    run = client.post("/v1/runs", json={"project": "p", "name": "r"}).json()
    steps = [place_checkpoint(client, data_dir, run, s) for s in (1, 2, 3)]
    sweep = sweep_now(client)
    first, second = sweep["actions"]
    held = [e for e in trail(client, actor="rule:tiering/keep-1") if e["event"] == "created"]
    assert [e["after"]["state"] for e in held] == ["held", "held"]  # beyond the blast radius
    assert client.post(f"/v1/actions/{first}/approve").status_code == 200
    assert client.post(f"/v1/sweeps/{sweep['id']}/approve").json()["actions"] == [second]
    approved = [e for e in trail(client, actor=actor) if e["event"] == "approved"]
    assert sorted(e["entity_id"] for e in approved) == sorted([first, second])
    assert all(e["reason"] == "tiering/keep-1" for e in approved)
    assert approved[0]["before"] == {"state": "held"}
    assert approved[0]["after"] == {"state": "pending", "approved_by": actor}

    # undelete before the worker ran: the delete is withdrawn, as the person who asked
    target = next(e["checkpoint_id"] for e in approved if e["entity_id"] == first)
    assert client.post(f"/v1/checkpoints/{target}/undelete").status_code == 200
    withdrawn = trail(client, checkpoint_id=target)[-1]
    assert (withdrawn["entity_id"], withdrawn["event"], withdrawn["actor"]) == (
        first,
        "cancelled",
        actor,
    )
    assert withdrawn["after"] == {"state": "cancelled", "error": "withdrawn by undelete"}

    # a restore blocked for now (a file where its directory goes): back to pending to retry
    worker = make_executor(auth_app)
    worker.drain()  # the approved delete that was not withdrawn
    source = steps[2]
    blocker = step_dir(data_dir, "cold", run, 3)
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"in the way")
    restore = client.post(f"/v1/checkpoints/{source['id']}/restore", json={"tier": "cold"})
    assert worker.claim() == restore.json()["id"]
    worker.execute(restore.json()["id"])
    events = trail(client, checkpoint_id=source["id"])
    assert [(e["event"], e["reason"]) for e in events[-3:]] == [
        ("created", "manual"),
        ("claimed", "manual"),
        ("retry", "manual"),
    ]
    assert events[-1]["before"] == {"state": "running"}
    assert events[-1]["after"]["state"] == "pending" and events[-1]["after"]["error"]


def test_a_failed_request_leaves_no_event(
    auth_app: FastAPI, ops: tuple[str, TestClient], clean_engine: Engine, data_dir: Path
) -> None:
    _actor, client = ops
    run = client.post("/v1/runs", json={"project": "p", "name": "r"}).json()
    checkpoint = place_checkpoint(client, data_dir, run, 1)
    client.post(f"/v1/checkpoints/{checkpoint['id']}/pin", json={"reason": "paper"})
    before = count_events(clean_engine)

    conflict = client.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={"step": 1, "class": "milestone", "uri": checkpoint["uri"]},
    )
    assert conflict.status_code == 409
    assert client.delete(f"/v1/checkpoints/{checkpoint['id']}").status_code == 409  # pinned
    bad_patch = client.patch(
        f"/v1/runs/{run['id']}", json={"labels": {"a": "b"}, "ended_at": iso(datetime.now(UTC))}
    )
    assert bad_patch.status_code == 422
    assert client.post("/v1/tokens", json={"name": "x", "scopes": ["root"]}).status_code == 422
    assert client.put("/v1/policies/bad", json={"rules": [{"name": "r"}]}).status_code == 422
    assert client.delete("/v1/policies/nope").status_code == 404
    assert count_events(clean_engine) == before

    # an event is part of its change's transaction: rolled back together
    with auth_app.state.session_factory() as session:
        set_pin(session, checkpoint_id=checkpoint["id"], reason=None, actor="test")
        session.rollback()
    assert count_events(clean_engine) == before
    with session_scope(auth_app.state.session_factory) as session:
        set_pin(session, checkpoint_id=checkpoint["id"], reason=None, actor="test")
    assert count_events(clean_engine) == before + 1


def test_only_admins_read_the_trail(auth_app: FastAPI, ops: tuple[str, TestClient]) -> None:
    _id, secret = issue_token(auth_app, name="reader", scopes=("read",), projects=("*",))
    assert token_client(auth_app, secret).get("/v1/audit").status_code == 403
    assert token_client(auth_app, None).get("/v1/audit").status_code == 401
