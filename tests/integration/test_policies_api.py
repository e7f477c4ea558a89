"""Policies over HTTP: PUT as YAML or JSON, read, list, delete; invalid documents refused with
the rule and field named and nothing stored; policy files loaded (and validated) at start."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.db.models import PolicyRow
from app.policy.loading import PolicyFileError
from app.settings import Settings
from tests.builders import assert_problem, list_all

YAML = {"content-type": "application/yaml"}

KEEP_3 = """\
name: keep-3
description: three rolling checkpoints
applies_to: {projects: ["llm-*"], labels: {team: core}}
priority: 5
rules:
  - name: rolling-keep-3
    class: rolling
    keep_last: 3
    action: delete
  - name: milestones-cold
    class: [milestone]
    when: {run_ended: 30d, on_tier: [hot, warm]}
    action: {move_to: cold}
"""

KEEP_3_DOCUMENT = {
    "name": "keep-3",
    "description": "three rolling checkpoints",
    "applies_to": {"projects": ["llm-*"], "labels": {"team": "core"}},
    "priority": 5,
    "rules": [
        {"name": "rolling-keep-3", "class": "rolling", "keep_last": 3, "action": "delete"},
        {
            "name": "milestones-cold",
            "class": ["milestone"],
            "when": {"run_ended": "30d", "on_tier": ["hot", "warm"]},
            "action": {"move_to": "cold"},
        },
    ],
}


def put_yaml(client: TestClient, name: str, text: str) -> Any:
    return client.put(f"/v1/policies/{name}", content=text, headers=YAML)


def stored_names(client: TestClient) -> list[str]:
    items, _ = list_all(client, "/v1/policies", 100)
    return [p["name"] for p in items]


# --- PUT, GET, list, DELETE --------------------------------------------------------------


def test_put_yaml_stores_the_validated_policy(client: TestClient) -> None:
    response = put_yaml(client, "keep-3", KEEP_3)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["name"] == "keep-3"
    assert body["source"] == "api"
    assert body["policy"] == KEEP_3_DOCUMENT
    fetched = client.get("/v1/policies/keep-3")
    assert fetched.status_code == 200
    assert fetched.json() == body
    listed = client.get("/v1/policies").json()
    assert listed == {"items": [body], "next_cursor": None}


def test_a_dry_run_validates_and_stores_nothing(client: TestClient) -> None:
    """What an editor sends at each keystroke: the answer a save would give and nothing
    stored; a mistake is the same 422 naming the rule and field."""
    response = client.put(
        "/v1/policies/keep-3?dry_run=true",
        content=KEEP_3,
        headers={"Content-Type": "application/yaml"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["policy"] == KEEP_3_DOCUMENT
    assert stored_names(client) == []
    assert_problem(client.get("/v1/policies/keep-3"), 404)
    wrong = KEEP_3.replace("keep_last: 3", "keep_last: lots")
    body = assert_problem(
        client.put(
            "/v1/policies/keep-3?dry_run=true",
            content=wrong,
            headers={"Content-Type": "application/yaml"},
        ),
        422,
    )
    assert body["field"].endswith(".keep_last")
    assert stored_names(client) == []


@pytest.mark.parametrize("media", ["application/x-yaml", "text/yaml"])
def test_put_takes_the_other_yaml_media_types(client: TestClient, media: str) -> None:
    response = client.put(
        "/v1/policies/keep-3", content=KEEP_3, headers={"content-type": f"{media}; charset=utf-8"}
    )

    assert response.status_code == 200, response.text
    assert response.json()["policy"] == KEEP_3_DOCUMENT


def test_put_json_takes_the_name_from_the_path(client: TestClient) -> None:
    document = {k: v for k, v in KEEP_3_DOCUMENT.items() if k != "name"}

    response = client.put("/v1/policies/keep-3", json=document)

    assert response.status_code == 200, response.text
    assert response.json()["policy"] == KEEP_3_DOCUMENT
    assert client.get("/v1/policies/keep-3").json()["policy"] == KEEP_3_DOCUMENT


def test_put_json_with_the_same_name_in_body_and_path(client: TestClient) -> None:
    response = client.put("/v1/policies/keep-3", json=KEEP_3_DOCUMENT)

    assert response.status_code == 200, response.text
    assert response.json()["policy"] == KEEP_3_DOCUMENT


def test_put_again_replaces_the_policy(client: TestClient) -> None:
    assert put_yaml(client, "keep-3", KEEP_3).status_code == 200
    replaced = KEEP_3.replace("keep_last: 3", "keep_last: 5")

    response = put_yaml(client, "keep-3", replaced)

    assert response.status_code == 200, response.text
    assert response.json()["policy"]["rules"][0]["keep_last"] == 5
    assert client.get("/v1/policies/keep-3").json()["policy"]["rules"][0]["keep_last"] == 5
    assert stored_names(client) == ["keep-3"]


def test_delete_answers_204_and_forgets_the_policy(client: TestClient) -> None:
    assert put_yaml(client, "keep-3", KEEP_3).status_code == 200

    response = client.delete("/v1/policies/keep-3")

    assert response.status_code == 204
    assert response.content == b""
    assert_problem(client.get("/v1/policies/keep-3"), 404)
    assert stored_names(client) == []
    assert_problem(client.delete("/v1/policies/keep-3"), 404)


def test_unknown_policy_is_404(client: TestClient) -> None:
    assert_problem(client.get("/v1/policies/nothing"), 404)


def test_list_is_sorted_by_name_and_paginated(client: TestClient) -> None:
    names = ["delta", "alpha", "echo", "charlie", "bravo"]
    for name in names:
        response = client.put(f"/v1/policies/{name}", json={"rules": []})
        assert response.status_code == 200, response.text

    items, pages = list_all(client, "/v1/policies", 2)

    assert [p["name"] for p in items] == sorted(names)
    assert pages == 3


# --- invalid policies: 422 naming the rule and the field, nothing stored -----------------

RULE = "  - name: rolling-keep\n    class: rolling\n"


@pytest.mark.parametrize(
    ("rule_body", "field", "words"),
    [
        ("    keep_lst: 3\n    action: delete\n", "keep_lst", ["Extra inputs"]),
        ("    action: {move_to: glacier}\n", "action", ["unknown tier", "glacier"]),
        ("    when: {on_tier: [tape]}\n    action: delete\n", "when", ["unknown tier", "tape"]),
        ("    keep_last: -2\n    action: delete\n", "keep_last", ["negative"]),
        (
            "    keep_best: {metric: eval_loss, mode: min, count: -5}\n    action: delete\n",
            "keep_best.count",
            ["negative"],
        ),
        ("    when: {run_ended: 7 days}\n    action: delete\n", "when.run_ended", ["7 days"]),
        ("    keep_within: 3x\n    action: delete\n", "keep_within", ["3x"]),
    ],
    ids=[
        "unknown-field",
        "unknown-tier",
        "unknown-on-tier",
        "negative-count",
        "negative-keep-best",
        "bad-duration",
        "bad-keep-within",
    ],
)
def test_invalid_policy_is_422_naming_rule_and_field(
    client: TestClient, rule_body: str, field: str, words: list[str]
) -> None:
    text = f"name: bad\nrules:\n  - name: fine\n    action: delete\n{RULE}{rule_body}"

    body = assert_problem(put_yaml(client, "bad", text), 422)

    assert body["field"] == f"rules[1] (rolling-keep).{field}", body
    for word in ["rolling-keep", field, *words]:
        assert word in body["detail"], body
    assert_problem(client.get("/v1/policies/bad"), 404)
    assert stored_names(client) == []


def test_invalid_json_policy_is_422_too(client: TestClient) -> None:
    document = {"rules": [{"name": "r1", "keep_last": -3, "action": "delete"}]}

    body = assert_problem(client.put("/v1/policies/bad", json=document), 422)

    assert body["field"] == "rules[0] (r1).keep_last"
    assert stored_names(client) == []


def test_invalid_replacement_leaves_the_stored_policy_alone(client: TestClient) -> None:
    before = put_yaml(client, "keep-3", KEEP_3).json()

    bad = KEEP_3.replace("keep_last: 3", "keep_last: -7")
    assert_problem(put_yaml(client, "keep-3", bad), 422, "rules")

    assert client.get("/v1/policies/keep-3").json() == before


def test_unknown_top_level_field_is_refused(client: TestClient) -> None:
    body = assert_problem(put_yaml(client, "bad", "name: bad\nrulez: []\n"), 422, "rulez")

    assert "Extra inputs" in body["detail"]
    assert stored_names(client) == []


def test_name_in_body_must_match_the_path(client: TestClient) -> None:
    body = assert_problem(put_yaml(client, "other", KEEP_3), 422, "name")

    assert "keep-3" in body["detail"] and "other" in body["detail"]
    json_body = assert_problem(client.put("/v1/policies/other", json=KEEP_3_DOCUMENT), 422)
    assert json_body["field"] == "name"
    assert stored_names(client) == []


@pytest.mark.parametrize(
    ("content", "headers", "field"),
    [
        ("name: [bad\n", YAML, "body"),
        ("- just\n- a list\n", YAML, "policy"),
        ("{not json", {"content-type": "application/json"}, "body"),
        ("name: bad\nrules: []\n", {"content-type": "text/plain"}, "body"),
    ],
    ids=["malformed-yaml", "yaml-list", "malformed-json", "yaml-as-text"],
)
def test_unreadable_bodies_are_422(
    client: TestClient, content: str, headers: dict[str, str], field: str
) -> None:
    assert_problem(client.put("/v1/policies/bad", content=content, headers=headers), 422, field)
    assert stored_names(client) == []


# --- policy files: loaded at start, a bad one stops start-up ----------------------------


def test_policy_files_are_loaded_at_start(app: FastAPI, settings: Settings) -> None:
    settings.policies_dir.mkdir(parents=True)
    (settings.policies_dir / "keep-3.yaml").write_text(KEEP_3)
    (settings.policies_dir / "other.yml").write_text("name: other\nrules: []\n")
    (settings.policies_dir / "notes.txt").write_text("not a policy")

    with TestClient(app) as client:
        fetched = client.get("/v1/policies/keep-3")
        assert fetched.status_code == 200, fetched.text
        assert fetched.json()["policy"] == KEEP_3_DOCUMENT
        assert fetched.json()["source"] == str(settings.policies_dir / "keep-3.yaml")
        assert stored_names(client) == ["keep-3", "other"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (KEEP_3.replace("keep_last: 3", "keep_last: -2"), ["rolling-keep-3", "keep_last"]),
        (KEEP_3.replace("move_to: cold", "move_to: glacier"), ["milestones-cold", "glacier"]),
        (KEEP_3.replace("run_ended: 30d", "run_ended: a month"), ["milestones-cold", "run_ended"]),
        (KEEP_3.replace("    keep_last: 3", "    keep_lats: 3"), ["rolling-keep-3", "keep_lats"]),
    ],
    ids=["negative-count", "unknown-tier", "bad-duration", "unknown-field"],
)
def test_a_bad_policy_file_stops_start_up(
    app: FastAPI, settings: Settings, text: str, words: list[str]
) -> None:
    settings.policies_dir.mkdir(parents=True)
    (settings.policies_dir / "a-good.yaml").write_text("name: good\nrules: []\n")
    bad = settings.policies_dir / "keep-3.yaml"
    bad.write_text(text)

    with pytest.raises(PolicyFileError) as raised, TestClient(app):
        pytest.fail("the app started with a bad policy file")

    message = str(raised.value)
    for word in [str(bad), *words]:
        assert word in message, message
    with app.state.session_factory() as session:
        assert session.execute(select(func.count()).select_from(PolicyRow)).scalar_one() == 0


def test_two_files_with_one_name_stop_start_up(app: FastAPI, settings: Settings) -> None:
    settings.policies_dir.mkdir(parents=True)
    (settings.policies_dir / "a.yaml").write_text(KEEP_3)
    (settings.policies_dir / "b.yaml").write_text(KEEP_3)

    with pytest.raises(PolicyFileError, match="keep-3"), TestClient(app):
        pytest.fail("the app started with two policies of one name")
