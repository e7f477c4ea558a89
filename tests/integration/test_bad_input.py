"""Bad input gets a 4xx problem answer naming the field at fault, and nothing is written
(DESIGN 8.5): after every refusal the catalog reads exactly as before.

Refusals write nothing, so each test sends many bad requests to one app, one subtest each."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import assert_problem, make_run, register, write_checkpoint

Snapshot = Callable[[], Any]
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client, "proj", "run-1")


@pytest.fixture
def hot(data_dir: Path) -> Path:
    return (data_dir / "hot").resolve()


@pytest.fixture
def good_uri(hot: Path) -> str:
    return write_checkpoint(hot, "proj/run-1/step-1")


@pytest.fixture
def catalog(client: TestClient, run: dict[str, Any]) -> Snapshot:
    """What a user can read back: runs, the run's checkpoints in every state, tier usage."""

    def snapshot() -> Any:
        runs = client.get("/v1/runs").json()
        checkpoints = client.get(f"/v1/runs/{run['id']}/checkpoints").json()
        tiers = [(t["name"], t["usage"]) for t in client.get("/v1/tiers").json()["items"]]
        return runs, checkpoints, tiers

    return snapshot


def enc(values: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


# --- request bodies ------------------------------------------------------------------

MALFORMED = [
    b'{"project": "proj",',
    b"{'project': 'p'}",
    b'{"project": "p"}}',
    b"\xff\xfe",
    b"nul",
]


def test_malformed_json_is_400_naming_the_body(
    client: TestClient, run: dict[str, Any], catalog: Snapshot, subtests: pytest.Subtests
) -> None:
    before = catalog()
    for raw in MALFORMED:
        for path in ("/v1/runs", f"/v1/runs/{run['id']}/checkpoints"):
            with subtests.test(path=path, body=raw):
                response = client.post(path, content=raw, headers=JSON_HEADERS)
                assert_problem(response, 400, "body")
                assert catalog() == before


REGISTRATION_CASES: list[tuple[dict[str, Any], str]] = [
    ({"step": "100"}, "step"),
    ({"step": -1}, "step"),
    ({"step": True}, "step"),
    ({"step": 1.5}, "step"),
    ({"step": 2**63}, "step"),
    ({"step": None}, "step"),
    ({"labels": {"team": 1}}, "labels"),
    ({"labels": ["team"]}, "labels"),
    ({"labels": {"team": {"nested": "x"}}}, "labels"),
    ({"labels": {"": "empty key"}}, "labels"),
    ({"metrics": {"loss": "low"}}, "metrics"),
    ({"metrics": {"loss": "0.5"}}, "metrics"),
    ({"metrics": {"loss": True}}, "metrics"),
    ({"metrics": {"loss": None}}, "metrics"),
    ({"metrics": [1.0]}, "metrics"),
    ({"size_bytes": "7"}, "size_bytes"),
    ({"size_bytes": -7}, "size_bytes"),
    ({"committed": "yes"}, "committed"),
    ({"created_at": "yesterday"}, "created_at"),
    ({"klass": "rolling"}, "klass"),
    ({"class": "Rolling"}, "class"),
    ({"class": "-rolling"}, "class"),
    ({"class": ""}, "class"),
    ({"class": "x" * 64}, "class"),
    ({"class": 3}, "class"),
    ({"uri": ""}, "uri"),
    ({"uri": 42}, "uri"),
]


def test_wrong_registration_fields_are_422_naming_the_field(
    client: TestClient,
    run: dict[str, Any],
    good_uri: str,
    catalog: Snapshot,
    subtests: pytest.Subtests,
) -> None:
    before = catalog()
    for change, field in REGISTRATION_CASES:
        with subtests.test(change=change):
            body = {"step": 1, "class": "rolling", "uri": good_uri, **change}
            response = client.post(f"/v1/runs/{run['id']}/checkpoints", json=body)
            assert_problem(response, 422, field)
            assert catalog() == before


def test_missing_required_fields_are_named(
    client: TestClient, run: dict[str, Any], catalog: Snapshot
) -> None:
    before = catalog()
    body = assert_problem(client.post(f"/v1/runs/{run['id']}/checkpoints", json={}), 422)
    named = {e["field"] for e in body["errors"]}
    assert {"step", "class", "uri"} <= named
    assert_problem(client.post(f"/v1/runs/{run['id']}/checkpoints", json=[1]), 422, "body")
    assert_problem(client.post("/v1/runs", json={"project": "proj"}), 422, "name")
    assert catalog() == before


def test_non_finite_metrics_are_422(
    client: TestClient,
    run: dict[str, Any],
    good_uri: str,
    catalog: Snapshot,
    subtests: pytest.Subtests,
) -> None:
    before = catalog()
    for number in ("NaN", "Infinity", "-Infinity", "1e999"):
        with subtests.test(number=number):
            body = {"step": 1, "class": "rolling", "uri": good_uri, "metrics": {"m": 0}}
            raw = json.dumps(body).replace('"m": 0', f'"m": {number}')  # JSON has no NaN
            path = f"/v1/runs/{run['id']}/checkpoints"
            response = client.post(path, content=raw.encode(), headers=JSON_HEADERS)
            assert_problem(response, 422, "metrics")
            assert catalog() == before


RUN_CASES: list[tuple[dict[str, Any], str]] = [
    ({"project": "Proj", "name": "run"}, "project"),
    ({"project": "proj", "name": "Run"}, "name"),
    ({"project": "p" * 64, "name": "run"}, "project"),
    ({"project": "proj", "name": "r" * 64}, "name"),
    ({"project": "-proj", "name": "run"}, "project"),
    ({"project": "proj", "name": ".run"}, "name"),
    ({"project": "proj", "name": "a/b"}, "name"),
    ({"project": "proj", "name": "run\n"}, "name"),
    ({"project": "", "name": "run"}, "project"),
    ({"project": 7, "name": "run"}, "project"),
    ({"project": "proj", "name": "run", "labels": {"a": 1}}, "labels"),
    ({"project": "proj", "name": "run", "labels": "a=b"}, "labels"),
    ({"project": "proj", "name": "run", "labels": {"k": "v" * 257}}, "labels"),
    ({"project": "proj", "name": "run", "policy": "Keep Three"}, "policy"),
    ({"project": "proj", "name": "run", "resumed_from": "c" * 41}, "resumed_from"),
    ({"project": "proj", "name": "run", "status": "completed"}, "status"),
]


def test_bad_run_creation_is_422_naming_the_field(
    client: TestClient, catalog: Snapshot, subtests: pytest.Subtests
) -> None:
    before = catalog()
    for body, field in RUN_CASES:
        with subtests.test(body=body):
            assert_problem(client.post("/v1/runs", json=body), 422, field)
            assert catalog() == before


def test_a_valid_name_at_the_length_limit_is_accepted(client: TestClient) -> None:
    longest = "a" + "b" * 62
    response = client.post("/v1/runs", json={"project": longest, "name": "0.x_y-z"})
    assert response.status_code == 201, response.text


PATCH_CASES: list[tuple[dict[str, Any], str]] = [
    ({"status": "done"}, "status"),
    ({"labels": {"a": 2}}, "labels"),
    ({"ended_at": "soon"}, "ended_at"),
    ({"policy": "UPPER"}, "policy"),
    ({"name": "renamed"}, "name"),
]


def test_bad_run_patch_is_422_and_changes_nothing(
    client: TestClient, run: dict[str, Any], catalog: Snapshot, subtests: pytest.Subtests
) -> None:
    before = catalog()
    for patch, field in PATCH_CASES:
        with subtests.test(patch=patch):
            response = client.patch(f"/v1/runs/{run['id']}", json=patch)
            assert_problem(response, 422, field)
            assert catalog() == before


def test_a_resumed_from_naming_nothing_is_a_404_and_changes_nothing(
    client: TestClient, run: dict[str, Any], catalog: Snapshot, subtests: pytest.Subtests
) -> None:
    before = catalog()
    for missing in ("ckpt_missing", "ckpt_\u0000"):
        with subtests.test(resumed_from=missing):
            body = {"project": "proj", "name": "run", "resumed_from": missing}
            assert_problem(client.post("/v1/runs", json=body), 404, "resumed_from")
            patch = client.patch(f"/v1/runs/{run['id']}", json={"resumed_from": missing})
            assert_problem(patch, 404, "resumed_from")
            assert catalog() == before


# --- where objects live ----------------------------------------------------------------

ELSEWHERE: dict[str, Callable[[Path, Path], str]] = {
    "outside-every-tier": lambda hot, tmp: f"file://{tmp}/elsewhere/step-1",
    "system-dir": lambda hot, tmp: "file:///etc",
    "tier-root": lambda hot, tmp: f"file://{hot}",
    "sibling-prefix": lambda hot, tmp: f"file://{hot}-sibling/proj/step-1",
    "ftp": lambda hot, tmp: f"ftp://files.example.com{hot}/proj/run-1/step-1",
    "http": lambda hot, tmp: f"http://127.0.0.1{hot}/proj/run-1/step-1",
    "unknown-bucket": lambda hot, tmp: "s3://unknown-bucket/proj/run-1/step-1",
    "dotdot": lambda hot, tmp: f"file://{hot}/proj/run-1/../../../outside",
    "encoded-dotdot": lambda hot, tmp: f"file://{hot}/proj/%2e%2e/%2e%2e/%2e%2e/outside",
    "query": lambda hot, tmp: f"file://{hot}/proj/run-1/step-1?version=2",
    "remote-host": lambda hot, tmp: f"file://remote-host{hot}/proj/run-1/step-1",
    "no-scheme": lambda hot, tmp: f"{hot}/proj/run-1/step-1",
    "relative": lambda hot, tmp: "file://relative/path",
}


def test_uris_that_no_tier_holds_are_422_naming_uri(
    client: TestClient,
    run: dict[str, Any],
    hot: Path,
    tmp_path: Path,
    catalog: Snapshot,
    subtests: pytest.Subtests,
) -> None:
    outside = tmp_path / "elsewhere" / "step-1"
    outside.mkdir(parents=True)
    (outside / "model.pt").write_bytes(b"x")
    before = catalog()
    files = [{"path": "model.pt", "size_bytes": 1}]

    for case, make_uri in ELSEWHERE.items():
        for extra in ({}, {"files": files}, {"committed": False}):
            with subtests.test(case=case, **extra):
                response = register(client, run["id"], 1, make_uri(hot, tmp_path), **extra)
                assert_problem(response, 422, "uri")
                assert catalog() == before


def test_a_missing_or_empty_directory_is_422_naming_uri(
    client: TestClient, run: dict[str, Any], hot: Path, catalog: Snapshot
) -> None:
    (hot / "proj/run-1/empty").mkdir(parents=True)
    before = catalog()

    missing = f"file://{hot}/proj/run-1/never-written"
    assert_problem(register(client, run["id"], 1, missing), 422, "uri")
    files = [{"path": "model.pt", "size_bytes": 1}]
    assert_problem(register(client, run["id"], 1, missing, files=files), 422, "uri")
    assert_problem(register(client, run["id"], 1, f"file://{hot}/proj/run-1/empty"), 422, "uri")
    assert catalog() == before


def test_a_uri_that_is_a_symlink_out_of_the_tier_is_422(
    client: TestClient, run: dict[str, Any], hot: Path, tmp_path: Path, catalog: Snapshot
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_bytes(b"private")
    (hot / "proj/run-1").mkdir(parents=True)
    os.symlink(secret, hot / "proj/run-1/step-1")
    uri = f"file://{hot}/proj/run-1/step-1"
    before = catalog()

    assert_problem(register(client, run["id"], 1, uri), 422, "uri")
    files = [{"path": "id_rsa", "size_bytes": 7}]
    assert_problem(register(client, run["id"], 1, uri, files=files), 422, "uri")
    assert_problem(register(client, run["id"], 1, uri, committed=False), 422, "uri")
    assert catalog() == before


def test_a_symlink_inside_the_checkpoint_leading_out_is_422(
    client: TestClient, run: dict[str, Any], hot: Path, tmp_path: Path, catalog: Snapshot
) -> None:
    (tmp_path / "passwd").write_bytes(b"root:x:0:0")
    (tmp_path / "outdir").mkdir()
    with_file = Path(write_checkpoint(hot, "proj/run-1/step-1").removeprefix("file://"))
    os.symlink(tmp_path / "passwd", with_file / "leak.pt")
    with_dir = Path(write_checkpoint(hot, "proj/run-1/step-2").removeprefix("file://"))
    os.symlink(tmp_path / "outdir", with_dir / "shards")
    before = catalog()

    leak = assert_problem(register(client, run["id"], 1, f"file://{with_file}"), 422, "uri")
    shards = assert_problem(register(client, run["id"], 2, f"file://{with_dir}"), 422, "uri")

    assert "leak.pt" in leak["detail"]
    assert "shards" in shards["detail"]
    assert catalog() == before


def test_a_symlink_that_stays_inside_the_tier_is_fine(
    client: TestClient, run: dict[str, Any], hot: Path
) -> None:
    real = Path(write_checkpoint(hot, "shared/blobs", {"w.bin": b"1234"}).removeprefix("file://"))
    step = Path(write_checkpoint(hot, "proj/run-1/step-1").removeprefix("file://"))
    os.symlink(real / "w.bin", step / "w.bin")

    response = register(client, run["id"], 1, f"file://{step}")

    assert response.status_code == 201, response.text
    assert {"path": "w.bin", "size_bytes": 4} in response.json()["files"]


def test_committing_through_a_symlink_placed_after_reserving_is_422(
    client: TestClient, run: dict[str, Any], hot: Path, tmp_path: Path
) -> None:
    uri = f"file://{hot}/proj/run-1/step-1"
    reserved = register(client, run["id"], 1, uri, committed=False)
    assert reserved.status_code == 201, reserved.text
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "model.pt").write_bytes(b"x")
    (hot / "proj/run-1").mkdir(parents=True, exist_ok=True)
    os.symlink(tmp_path / "outside", hot / "proj/run-1/step-1")
    before = client.get(f"/v1/checkpoints/{reserved.json()['id']}").json()
    url = f"/v1/checkpoints/{before['id']}/commit"

    assert_problem(client.post(url, json={}), 422, "uri")
    assert_problem(client.post(url, json={"files": [{"path": "model.pt", "size_bytes": 1}]}), 422)
    assert client.get(f"/v1/checkpoints/{before['id']}").json() == before


BAD_MANIFESTS: dict[str, Any] = {
    "dotdot": [{"path": "../model.pt", "size_bytes": 1}],
    "inner-dotdot": [{"path": "shards/../../model.pt", "size_bytes": 1}],
    "absolute": [{"path": "/etc/passwd", "size_bytes": 1}],
    "empty-segment": [{"path": "shards//model.pt", "size_bytes": 1}],
    "dot": [{"path": "./model.pt", "size_bytes": 1}],
    "backslash": [{"path": "dir\\model.pt", "size_bytes": 1}],
    "empty": [{"path": "", "size_bytes": 1}],
    "duplicate": [{"path": "model.pt", "size_bytes": 1}, {"path": "model.pt", "size_bytes": 1}],
    "negative-size": [{"path": "model.pt", "size_bytes": -1}],
    "size-as-string": [{"path": "model.pt", "size_bytes": "1"}],
    "no-size": [{"path": "model.pt"}],
    "bad-sha256": [{"path": "model.pt", "size_bytes": 1, "sha256": "not-a-digest"}],
    "unknown-key": [{"path": "model.pt", "size_bytes": 1, "md5": "0" * 32}],
    "bare-string": ["model.pt"],
    "not-a-list": {"model.pt": 1},
}


def test_bad_manifests_are_422_naming_files(
    client: TestClient,
    run: dict[str, Any],
    good_uri: str,
    catalog: Snapshot,
    subtests: pytest.Subtests,
) -> None:
    before = catalog()
    for case, files in BAD_MANIFESTS.items():
        with subtests.test(case=case):
            response = register(client, run["id"], 1, good_uri, files=files)
            assert_problem(response, 422, "files")
            later = good_uri + "-later"
            reserve = register(client, run["id"], 2, later, committed=False, files=files)
            assert_problem(reserve, 422, "files")
            assert catalog() == before


def test_a_manifest_path_error_names_the_entry(
    client: TestClient, run: dict[str, Any], good_uri: str
) -> None:
    files = [{"path": "ok.pt", "size_bytes": 1}, {"path": "../escape.pt", "size_bytes": 1}]
    body = assert_problem(register(client, run["id"], 1, good_uri, files=files), 422)
    assert body["field"] == "files[1].path"


def test_bad_commit_bodies_are_refused_and_change_nothing(
    client: TestClient, run: dict[str, Any], hot: Path
) -> None:
    reserved = register(client, run["id"], 1, f"file://{hot}/proj/run-1/step-1", committed=False)
    checkpoint = reserved.json()
    write_checkpoint(hot, "proj/run-1/step-1")
    url = f"/v1/checkpoints/{checkpoint['id']}/commit"

    assert_problem(client.post(url, content=b"{", headers=JSON_HEADERS), 400, "body")
    bad_path = {"files": [{"path": "../x", "size_bytes": 1}]}
    assert_problem(client.post(url, json=bad_path), 422, "files")
    assert_problem(client.post(url, json={"size_bytes": "15"}), 422, "size_bytes")
    assert_problem(client.post(url, json={"metrics": {"loss": "low"}}), 422, "metrics")
    assert_problem(client.post(url, json={"state": "active"}), 422, "state")
    assert client.get(f"/v1/checkpoints/{checkpoint['id']}").json() == checkpoint


def test_bad_pin_reasons_are_422(client: TestClient, run: dict[str, Any], good_uri: str) -> None:
    checkpoint = register(client, run["id"], 1, good_uri).json()
    url = f"/v1/checkpoints/{checkpoint['id']}/pin"

    assert_problem(client.post(url, json={"reason": "bad\u0000byte"}), 422, "reason")
    assert_problem(client.post(url, json={"reason": "r" * 501}), 422, "reason")
    assert_problem(client.post(url, json={"reason": 5}), 422, "reason")
    assert client.get(f"/v1/checkpoints/{checkpoint['id']}").json() == checkpoint


# --- query strings and paths -----------------------------------------------------------


def test_bad_page_sizes_are_422_naming_limit(
    client: TestClient, run: dict[str, Any], subtests: pytest.Subtests
) -> None:
    for limit in ("1001", "0", "-1", "ten", "1e3", "99999999999999999999"):
        for path in ("/v1/runs", f"/v1/runs/{run['id']}/checkpoints"):
            with subtests.test(path=path, limit=limit):
                assert_problem(client.get(path, params={"limit": limit}), 422, "limit")


def test_the_largest_page_size_is_accepted(client: TestClient, run: dict[str, Any]) -> None:
    for path in ("/v1/runs", f"/v1/runs/{run['id']}/checkpoints"):
        assert client.get(path, params={"limit": 1000}).status_code == 200


BAD_STEP_CURSORS = {
    "garbage": "not a cursor!",
    "percent": "%%%",
    "not-utf8": base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
    "empty-list": enc([]),
    "two-values": enc([1, 2]),
    "object": enc({"step": 1}),
    "float": enc([1.5]),
    "bool": enc([True]),
    "huge": enc([10**30]),
    "null": enc([None]),
    "string": enc(["100"]),
}


def test_bad_checkpoint_cursors_are_400_naming_cursor(
    client: TestClient, run: dict[str, Any], subtests: pytest.Subtests
) -> None:
    for case, cursor in BAD_STEP_CURSORS.items():
        with subtests.test(case=case):
            path = f"/v1/runs/{run['id']}/checkpoints"
            assert_problem(client.get(path, params={"cursor": cursor}), 400, "cursor")


def test_bad_run_cursors_are_400_naming_cursor(
    client: TestClient, subtests: pytest.Subtests
) -> None:
    for cursor in ("not a cursor!", enc([5]), enc(["a", "b"]), enc(["run_\u0000"])):
        with subtests.test(cursor=cursor):
            assert_problem(client.get("/v1/runs", params={"cursor": cursor}), 400, "cursor")


def test_a_cursor_from_another_list_is_refused(client: TestClient, run: dict[str, Any]) -> None:
    make_run(client, "proj", "run-2")
    runs_cursor = client.get("/v1/runs", params={"limit": 1}).json()["next_cursor"]
    assert runs_cursor
    response = client.get(f"/v1/runs/{run['id']}/checkpoints", params={"cursor": runs_cursor})
    assert_problem(response, 400, "cursor")


def test_an_overlong_cursor_is_refused_naming_cursor(client: TestClient) -> None:
    assert_problem(client.get("/v1/runs", params={"cursor": "a" * 600}), 422, "cursor")


def test_bad_filters_are_422(
    client: TestClient, run: dict[str, Any], subtests: pytest.Subtests
) -> None:
    checkpoints = f"/v1/runs/{run['id']}/checkpoints"
    cases = [
        ("/v1/runs", {"status": "finished"}, "status"),
        ("/v1/runs", {"project": "UPPER"}, "project"),
        ("/v1/runs", {"project": "x" * 64}, "project"),
        (checkpoints, {"state": "gone"}, "state"),
        (checkpoints, {"class": "Not A Class"}, "class"),
    ]
    for path, params, field in cases:
        with subtests.test(path=path, params=params):
            assert_problem(client.get(path, params=params), 422, field)


def test_unknown_routes_are_404_problem(client: TestClient, subtests: pytest.Subtests) -> None:
    for method, path in [
        ("GET", "/v1/nothing-here"),
        ("GET", "/v2/runs"),
        ("POST", "/v1/runs/x/y/z"),
        ("GET", "/console/no-such-page.js"),
    ]:
        with subtests.test(method=method, path=path):
            assert_problem(client.request(method, path), 404)


def test_a_wrong_method_is_405_problem(client: TestClient, run: dict[str, Any]) -> None:
    assert_problem(client.put(f"/v1/runs/{run['id']}", json={}), 405)
    assert_problem(client.delete("/v1/runs"), 405)


def test_odd_ids_are_unknown_ids(
    client: TestClient,
    run: dict[str, Any],
    good_uri: str,
    catalog: Snapshot,
    subtests: pytest.Subtests,
) -> None:
    before = catalog()
    reads = [
        "/v1/runs/run%00x",
        "/v1/runs/run%00x/checkpoints",
        "/v1/checkpoints/ckpt%00x",
        "/v1/runs/" + "r" * 300,
        "/v1/checkpoints/%E2%98%83",
    ]
    for path in reads:
        with subtests.test(path=path):
            assert_problem(client.get(path), 404)
    writes: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/runs/run%00x/checkpoints", {"step": 1, "class": "r", "uri": good_uri}),
        ("PATCH", "/v1/runs/run%00x", {"status": "failed"}),
        ("POST", "/v1/checkpoints/ckpt%00x/pin", {"reason": "r"}),
        ("DELETE", "/v1/checkpoints/ckpt%00x/pin", {}),
        ("POST", "/v1/checkpoints/ckpt%00x/commit", {}),
    ]
    for method, path, body in writes:
        with subtests.test(method=method, path=path):
            response = client.request(method, path, json=body or None)
            assert_problem(response, 404)
            assert catalog() == before


# --- messages for a person ----------------------------------------------------------------


def test_a_body_not_sent_as_json_is_told_so(
    client: TestClient, run: dict[str, Any], good_uri: str, catalog: Snapshot
) -> None:
    before = catalog()
    bodies = {
        "/v1/runs": {"project": "proj", "name": "run-2"},
        f"/v1/runs/{run['id']}/checkpoints": {"step": 1, "class": "rolling", "uri": good_uri},
        "/v1/plan": {"project": "proj"},
    }
    for path, body in bodies.items():
        for headers in (
            {},
            {"content-type": "text/plain"},
            {"content-type": "application/x-www-form-urlencoded"},
        ):
            response = client.post(path, content=json.dumps(body), headers=headers)
            problem = assert_problem(response, 415, "body")
            assert "content-type: application/json" in problem["detail"], problem
            assert headers.get("content-type", "without a content-type") in problem["detail"]
    assert catalog() == before


def test_a_validator_speaks_for_itself_without_pydantic_prefixes(
    client: TestClient, run: dict[str, Any], good_uri: str
) -> None:
    files = [{"path": "/etc/passwd", "size_bytes": 1}]
    response = register(client, run["id"], 1, good_uri, files=files)

    problem = assert_problem(response, 422, "files[0].path")
    assert "Value error" not in problem["detail"], problem
    assert "must be a relative path" in problem["detail"]
    assert problem["errors"][0]["message"].startswith("must be a relative path")


def test_a_misspelt_policy_action_names_the_actions_that_exist(client: TestClient) -> None:
    text = "name: p\nrules:\n  - name: r\n    keep_last: 3\n    action: delte\n"
    response = client.put(
        "/v1/policies/p", content=text, headers={"content-type": "application/yaml"}
    )

    problem = assert_problem(response, 422, "rules[0] (r).action")
    assert "'delte' is not an action" in problem["detail"], problem
    assert "delete, {move_to: <tier>} or {copy_to: <tier>}" in problem["detail"]
    for machinery in ("literal", "MoveTo", "instance of", "Input should"):
        assert machinery not in problem["detail"], problem


def test_a_closed_set_lists_its_members_once(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/runs", params={"status": "finished"}), 422, "status")

    assert "'active', 'completed' or 'failed'" in problem["detail"], problem
    assert "Input should" not in problem["detail"]
