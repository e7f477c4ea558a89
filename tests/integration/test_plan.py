"""POST /v1/plan: the dry run. What each policy would do now and why each checkpoint stays,
for the whole catalog, a project, a run, a stored policy or an inline what-if; it writes
nothing."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.api import plan_json
from app.api.lifecycle_schemas import PlanRead
from app.db.models import Action, Sweep
from app.services.lifecycle import plan_parts
from app.services.lifecycle.planning import CatalogPlan
from tests.builders import (
    ago,
    assert_problem,
    end_run,
    ledger,
    make_run,
    place_checkpoint,
    put_policy,
    step_dir,
    tree,
)

KEEP_3 = """\
name: llm
rules:
  - name: rolling-keep-3
    class: rolling
    keep_last: 3
    action: delete
  - name: milestones-cold
    class: milestone
    when: {run_ended: 30d}
    action: {move_to: cold}
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
"""


def plan(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/plan", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def by_step(items: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {item["step"]: item for item in items}


class Catalog:
    """Two projects, one active run each, five rolling checkpoints per run."""

    def __init__(self, client: TestClient, data_dir: Path) -> None:
        self.a = make_run(client, "proj-a", "run-1")
        self.b = make_run(client, "proj-b", "run-1")
        self.ckpts: dict[str, dict[int, dict[str, Any]]] = {}
        for run in (self.a, self.b):
            self.ckpts[run["id"]] = {
                step: place_checkpoint(
                    client,
                    data_dir,
                    run,
                    step,
                    created_at=ago(hours=10 - step),
                )
                for step in range(1, 6)
            }


@pytest.fixture
def catalog(client: TestClient, data_dir: Path) -> Catalog:
    put_policy(client, KEEP_3)
    return Catalog(client, data_dir)


def test_whole_catalog_plan_lists_actions_kept_and_totals(
    client: TestClient, catalog: Catalog
) -> None:
    result = plan(client)

    actions = result["actions"]
    assert sorted((a["run_id"], a["step"]) for a in actions) == sorted(
        (run["id"], step) for run in (catalog.a, catalog.b) for step in (1, 2)
    )
    for action in actions:
        checkpoint = catalog.ckpts[action["run_id"]][action["step"]]
        assert action == {
            "checkpoint_id": checkpoint["id"],
            "run_id": action["run_id"],
            "step": action["step"],
            "kind": "delete",
            "from_tier": "hot",
            "to_tier": None,
            "rule": "llm/rolling-keep-3",
            "reason": action["reason"],
            "bytes": checkpoint["size_bytes"],
            "state": "pending",
            "usd_month": 0.0,  # the default local tiers are not priced
            "one_off_usd": 0.0,
        }
        assert "rolling-keep-3" in action["reason"]
        assert "keep_last 3" in action["reason"]
    kept = {(k["checkpoint_id"]): k for k in result["kept"]}
    for run in (catalog.a, catalog.b):
        for step in (3, 4, 5):
            entry = kept[catalog.ckpts[run["id"]][step]["id"]]
            assert entry["step"] == step
            assert "rolling-keep-3: keep_last 3" in entry["reasons"]
        newest = kept[catalog.ckpts[run["id"]][5]["id"]]
        assert any(r.startswith("protected: resume point") for r in newest["reasons"]), newest
    assert len(result["kept"]) == 6
    assert result["skipped"] == []
    deleted = sum(a["bytes"] for a in actions)
    assert result["totals"] == {
        "deleted_bytes_by_tier": {"hot": deleted},
        "moved_bytes_by_tier": {},
        "copied_bytes_by_tier": {},
        "usd_month_by_tier": {"hot": 0.0},
        "one_off_usd": 0.0,
    }


def test_the_answer_is_the_documented_one_whatever_the_size_of_its_pieces(
    client: TestClient, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's JSON is written in pieces as it is sent: pieces of four entries (the
    four actions in one, the six kept in a full one and a short one, no skipped in none)
    give the same document, and that document is exactly what the response model
    describes, no field more or less."""
    whole = plan(client)
    monkeypatch.setattr(plan_parts, "PIECE", 4)
    pieces = plan(client)

    assert pieces == whole
    assert len(whole["actions"]) == 4 and len(whole["kept"]) == 6
    assert PlanRead.model_validate(whole).model_dump(mode="json") == whole


def test_the_collector_runs_again_once_the_answer_is_sent_or_dropped(
    client: TestClient, catalog: Catalog
) -> None:
    """The cyclic collector is paused from the plan's start to the answer's last byte (a
    million entries alive would make every pass visit them all): it must come back after
    a plan answered, after one refused, and after an answer that was never sent."""
    assert gc.isenabled()
    assert len(plan(client)["kept"]) == 6
    assert gc.isenabled()
    assert client.post("/v1/plan", json={"run_id": "nope"}).status_code == 404
    assert gc.isenabled()

    unsent = plan_json.plan_response(lambda: CatalogPlan())
    assert not gc.isenabled()
    del unsent  # the client went away before the first byte
    assert gc.isenabled()


def test_plan_writes_nothing(
    client: TestClient, app: FastAPI, catalog: Catalog, data_dir: Path
) -> None:
    disk = tree(data_dir)
    checkpoints = client.get(f"/v1/runs/{catalog.a['id']}/checkpoints").json()

    first = plan(client)
    second = plan(client, project="proj-a")

    assert first["actions"] and second["actions"]
    assert ledger(client) == []
    with app.state.session_factory() as session:
        assert session.execute(select(func.count()).select_from(Action)).scalar_one() == 0
        assert session.execute(select(func.count()).select_from(Sweep)).scalar_one() == 0
    assert tree(data_dir) == disk
    assert client.get(f"/v1/runs/{catalog.a['id']}/checkpoints").json() == checkpoints
    assert plan(client) == first


def test_plan_of_one_project(client: TestClient, catalog: Catalog) -> None:
    result = plan(client, project="proj-a")

    assert {a["run_id"] for a in result["actions"]} == {catalog.a["id"]}
    assert sorted(a["step"] for a in result["actions"]) == [1, 2]
    assert {k["checkpoint_id"] for k in result["kept"]} == {
        catalog.ckpts[catalog.a["id"]][s]["id"] for s in (3, 4, 5)
    }


def test_plan_of_an_unknown_project_is_a_404_naming_project(
    client: TestClient, catalog: Catalog
) -> None:
    # An empty plan would read as "nothing to do" for a project that was only misspelt.
    body = assert_problem(client.post("/v1/plan", json={"project": "nobody"}), 404, "project")

    assert "nobody" in body["detail"]


def test_plan_of_one_run(client: TestClient, data_dir: Path, catalog: Catalog) -> None:
    other = make_run(client, "proj-b", "run-2")
    for step in range(1, 6):
        place_checkpoint(client, data_dir, other, step)

    result = plan(client, run_id=other["id"])

    assert {a["run_id"] for a in result["actions"]} == {other["id"]}
    assert sorted(a["step"] for a in result["actions"]) == [1, 2]
    assert sorted(k["step"] for k in result["kept"]) == [3, 4, 5]


def test_unknown_run_id_is_a_404_naming_run_id(client: TestClient, catalog: Catalog) -> None:
    body = assert_problem(client.post("/v1/plan", json={"run_id": "run_nothing"}), 404, "run_id")

    assert "run_nothing" in body["detail"]


def test_a_run_with_its_own_project_is_the_plan_of_that_run(
    client: TestClient, catalog: Catalog
) -> None:
    together = plan(client, project="proj-a", run_id=catalog.a["id"])

    assert together == plan(client, run_id=catalog.a["id"])
    assert {a["run_id"] for a in together["actions"]} == {catalog.a["id"]}


def test_a_run_of_another_project_is_a_404_naming_run_id(
    client: TestClient, catalog: Catalog
) -> None:
    response = client.post("/v1/plan", json={"project": "proj-b", "run_id": catalog.a["id"]})

    assert_problem(response, 404, "run_id")


def test_unknown_field_in_the_request_is_refused(client: TestClient) -> None:
    assert_problem(client.post("/v1/plan", json={"projekt": "proj-a"}), 422, "projekt")


def test_inline_what_if_policy_is_applied_and_not_stored(
    client: TestClient, catalog: Catalog
) -> None:
    what_if = {
        "name": "what-if",
        "rules": [{"name": "keep-1", "class": "rolling", "keep_last": 1, "action": "delete"}],
    }

    result = plan(client, project="proj-a", policy=what_if)

    assert sorted(a["step"] for a in result["actions"]) == [1, 2, 3, 4]
    assert {a["rule"] for a in result["actions"]} == {"what-if/keep-1"}
    assert [k["step"] for k in result["kept"]] == [5]
    assert_problem(client.get("/v1/policies/what-if"), 404)
    assert [p["name"] for p in client.get("/v1/policies").json()["items"]] == ["llm"]
    assert ledger(client) == []


def test_inline_what_if_policy_is_validated(client: TestClient, catalog: Catalog) -> None:
    what_if = {"name": "what-if", "rules": [{"name": "r", "action": {"move_to": "tape"}}]}

    body = assert_problem(client.post("/v1/plan", json={"policy": what_if}), 422, "policy")

    assert body["field"] == "policy.rules[0] (r).action"
    assert "tape" in body["detail"]


def test_stored_policy_by_name_is_a_what_if(client: TestClient, catalog: Catalog) -> None:
    put_policy(
        client,
        "name: strict\napplies_to: {projects: [nothing-here]}\nrules:\n"
        "  - name: keep-2\n    class: rolling\n    keep_last: 2\n    action: delete\n",
    )

    governed = plan(client, project="proj-a")
    what_if = plan(client, project="proj-a", policy="strict")

    assert {a["rule"] for a in governed["actions"]} == {"llm/rolling-keep-3"}
    assert sorted(a["step"] for a in what_if["actions"]) == [1, 2, 3]
    assert {a["rule"] for a in what_if["actions"]} == {"strict/keep-2"}


def test_unknown_policy_name_is_a_404_naming_policy(client: TestClient, catalog: Catalog) -> None:
    body = assert_problem(client.post("/v1/plan", json={"policy": "nothing"}), 404, "policy")

    assert "nothing" in body["detail"]


def test_pinned_checkpoint_is_kept_with_its_reason(client: TestClient, catalog: Catalog) -> None:
    oldest = catalog.ckpts[catalog.a["id"]][1]
    pinned = client.post(f"/v1/checkpoints/{oldest['id']}/pin", json={"reason": "paper"})
    assert pinned.status_code == 200, pinned.text

    result = plan(client, project="proj-a")

    assert sorted(a["step"] for a in result["actions"]) == [2]
    kept = by_step(result["kept"])
    assert "protected: pinned" in kept[1]["reasons"]


def test_resume_point_is_kept_even_beyond_keep_last(client: TestClient, data_dir: Path) -> None:
    put_policy(
        client,
        "name: default\nrules:\n"
        "  - name: keep-none\n    class: rolling\n    keep_last: 0\n    action: delete\n",
    )
    run = make_run(client, "proj", "run-1")
    for step in (10, 20, 30):
        place_checkpoint(client, data_dir, run, step)

    active = plan(client, run_id=run["id"])
    end_run(client, run["id"], ago(days=1))
    ended = plan(client, run_id=run["id"])

    assert sorted(a["step"] for a in active["actions"]) == [10, 20]
    assert by_step(active["kept"])[30]["reasons"][0] == "protected: resume point of the active run"
    assert sorted(a["step"] for a in ended["actions"]) == [10, 20, 30]


def test_checkpoint_an_active_run_resumed_from_is_kept(client: TestClient, data_dir: Path) -> None:
    put_policy(client, KEEP_3.replace("name: llm", "name: default"))
    first = make_run(client, "proj", "run-1")
    ckpts = {step: place_checkpoint(client, data_dir, first, step) for step in range(1, 6)}
    end_run(client, first["id"], ago(days=1), status="failed")
    make_run(client, "proj", "run-2", resumed_from=ckpts[1]["id"])

    result = plan(client, run_id=first["id"])

    assert sorted(a["step"] for a in result["actions"]) == [2]
    assert "protected: an active run resumed from it" in by_step(result["kept"])[1]["reasons"]


def test_fresh_checkpoint_has_a_grace_period(client: TestClient, data_dir: Path) -> None:
    put_policy(client, KEEP_3.replace("name: llm", "name: default"))
    run = make_run(client, "proj", "run-1")
    for step in range(1, 5):
        place_checkpoint(client, data_dir, run, step, created_at=ago(seconds=10))
    end_run(client, run["id"], ago(seconds=0))

    result = plan(client, run_id=run["id"])

    assert result["actions"] == []
    assert "protected: created less than 60s ago" in by_step(result["kept"])[1]["reasons"]


def test_run_without_a_governing_policy_keeps_everything(
    client: TestClient, data_dir: Path
) -> None:
    put_policy(
        client,
        "name: elsewhere\napplies_to: {projects: [other-*]}\nrules:\n"
        "  - name: all\n    action: delete\n",
    )
    run = make_run(client, "proj", "run-1")
    for step in (1, 2):
        place_checkpoint(client, data_dir, run, step)

    result = plan(client)

    assert result["actions"] == []
    assert [k["reasons"] for k in result["kept"]] == [["no policy governs this run"]] * 2


def test_moves_and_copies_are_totalled_by_tier(client: TestClient, data_dir: Path) -> None:
    put_policy(client, KEEP_3)
    run = make_run(client, "proj", "run-1")
    milestones = [place_checkpoint(client, data_dir, run, s, "milestone") for s in (100, 200)]
    on_warm = place_checkpoint(client, data_dir, run, 300, "milestone", tier="warm")
    final = place_checkpoint(client, data_dir, run, 400, "final")
    waiting = plan(client)
    end_run(client, run["id"], ago(days=31))

    result = plan(client)

    assert waiting["actions"] == []
    assert any(
        "waiting, run_ended 30d not reached" in r for r in by_step(waiting["kept"])[100]["reasons"]
    )
    moves = [a for a in result["actions"] if a["kind"] == "move"]
    copies = [a for a in result["actions"] if a["kind"] == "copy"]
    assert sorted(a["step"] for a in moves) == [100, 200, 300]
    assert {a["rule"] for a in moves} == {"llm/milestones-cold"}
    assert {a["to_tier"] for a in moves} == {"cold"}
    assert [(a["step"], a["from_tier"], a["to_tier"]) for a in copies] == [(400, "hot", "archive")]
    assert copies[0]["rule"] == "llm/final-archive"
    assert by_step(result["kept"])[400]["reasons"][0] == "final-archive: copy to archive"
    hot_bytes = sum(m["size_bytes"] for m in milestones)
    assert result["totals"] == {
        "deleted_bytes_by_tier": {},
        "moved_bytes_by_tier": {"hot": hot_bytes, "warm": on_warm["size_bytes"]},
        "copied_bytes_by_tier": {"archive": final["size_bytes"]},
        # Every tier whose bill the actions change; none of these local tiers is priced.
        "usd_month_by_tier": {"hot": 0.0, "warm": 0.0, "cold": 0.0, "archive": 0.0},
        "one_off_usd": 0.0,
    }
    assert tree(step_dir(data_dir, "cold", run, 100)) == {}
