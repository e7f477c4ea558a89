"""Checkpoints over HTTP: registration (idempotent, conflicting), two-phase commit, listing,
locations, pins."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import (
    assert_problem,
    list_all,
    make_checkpoint,
    make_run,
    register,
    write_checkpoint,
)

FILES = {"model.pt": b"weights", "optim/state.pt": b"moments!", "optim/rng/0.bin": b"r"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entries(files: dict[str, bytes], *, checksums: bool = True) -> list[dict[str, Any]]:
    return [
        {"path": p, "size_bytes": len(d), **({"sha256": sha(d)} if checksums else {})}
        for p, d in files.items()
    ]


def steps(client: TestClient, run_id: str, **params: Any) -> list[int]:
    response = client.get(f"/v1/runs/{run_id}/checkpoints", params=params)
    assert response.status_code == 200, response.text
    return [c["step"] for c in response.json()["items"]]


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client, "proj", "run-1")


def test_register_with_files_answers_201_with_the_checkpoint(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-100", FILES)
    response = register(
        client,
        run["id"],
        100,
        uri,
        "milestone",
        files=entries(FILES),
        metrics={"loss": 1.25, "tokens": 4096},
        labels={"eval": "pending"},
        created_at="2026-05-01T10:00:00Z",
    )

    assert response.status_code == 201, response.text
    body = response.json()
    assert body["run_id"] == run["id"]
    assert body["step"] == 100
    assert body["class"] == "milestone"
    assert body["state"] == "active"
    assert body["uri"] == uri
    assert body["size_bytes"] == sum(len(d) for d in FILES.values())
    assert body["files"] == sorted(entries(FILES), key=lambda e: e["path"])
    assert body["metrics"] == {"loss": 1.25, "tokens": 4096.0}
    assert body["labels"] == {"eval": "pending"}
    assert body["pinned"] is False
    assert body["pin_reason"] is None
    assert datetime.fromisoformat(body["created_at"]) == datetime(2026, 5, 1, 10, tzinfo=UTC)
    assert body["tier"] == "hot"
    assert body["locations"] == [
        {"tier": "hot", "uri": uri, "storage_class": None, "role": "primary"}
    ]
    assert client.get(f"/v1/checkpoints/{body['id']}").json() == body


def test_register_without_files_lists_the_directory(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    files = {"a.safetensors": b"x" * 1500, "nested/deeper/b.bin": b"", "nested/c": b"12345"}
    uri = write_checkpoint(data_dir / "warm", "proj/run-1/step-7", files)

    before = datetime.now(UTC)
    body = make_checkpoint(client, run["id"], 7, uri)

    assert body["files"] == [
        {"path": "a.safetensors", "size_bytes": 1500},
        {"path": "nested/c", "size_bytes": 5},
        {"path": "nested/deeper/b.bin", "size_bytes": 0},
    ]
    assert body["size_bytes"] == 1505
    assert body["tier"] == "warm"
    assert datetime.fromisoformat(body["created_at"]) >= before  # defaults to registration time


def test_same_step_and_content_again_answers_200_with_the_same_checkpoint(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-100", FILES)
    first = make_checkpoint(client, run["id"], 100, uri, files=entries(FILES))

    again = register(client, run["id"], 100, uri, files=entries(FILES))
    listed_again = register(client, run["id"], 100, uri)  # no files: nothing to compare
    slash = register(client, run["id"], 100, uri + "/")  # the same place, spelled differently

    for response in (again, listed_again, slash):
        assert response.status_code == 200, response.text
        assert response.json() == first
    assert steps(client, run["id"]) == [100]


def test_optional_fields_left_out_never_conflict(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-5", FILES)
    total = sum(len(d) for d in FILES.values())
    first = make_checkpoint(
        client,
        run["id"],
        5,
        uri,
        files=entries(FILES),
        size_bytes=total,
        metrics={"loss": 2.0},
        labels={"a": "b"},
        created_at="2026-01-01T00:00:00Z",
    )

    variants: list[dict[str, Any]] = [
        {},
        {"files": entries(FILES, checksums=False)},
        {"size_bytes": total},
        {"files": entries(FILES), "size_bytes": total},
    ]
    for extra in variants:
        response = register(client, run["id"], 5, uri, **extra)
        assert response.status_code == 200, (extra, response.text)
        assert response.json()["id"] == first["id"]
    assert client.get(f"/v1/checkpoints/{first['id']}").json() == first


def _edit(files: list[dict[str, Any]], which: str, **changes: Any) -> list[dict[str, Any]]:
    """The manifest with the entry at path `which` changed."""
    return [{**e, **changes} if e["path"] == which else e for e in files]


def test_same_step_with_different_content_is_409_naming_step(
    client: TestClient, data_dir: Path, run: dict[str, Any], subtests: pytest.Subtests
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-100", FILES)
    copy = write_checkpoint(data_dir / "hot", "proj/run-1/step-100-copy", FILES)
    original = make_checkpoint(client, run["id"], 100, uri, files=entries(FILES))
    files = entries(FILES)
    unsummed = entries(FILES, checksums=False)

    cases: dict[str, tuple[str, str, dict[str, Any], str]] = {
        "class": ("final", uri, {}, "class"),
        "class-listed": ("milestone", uri, {"files": files}, "class"),
        "uri": ("rolling", copy, {}, "uri"),
        "fewer-files": ("rolling", uri, {"files": files[:1]}, "manifest"),
        "more-files": (
            "rolling",
            uri,
            {"files": [*files, {"path": "extra.bin", "size_bytes": 1}]},
            "manifest",
        ),
        "size": (
            "rolling",
            uri,
            {"files": _edit(unsummed, "model.pt", size_bytes=999)},
            "manifest",
        ),
        "sha256": (
            "rolling",
            uri,
            {"files": _edit(files, "model.pt", sha256="0" * 64)},
            "manifest",
        ),
        "path": ("rolling", uri, {"files": _edit(files, "model.pt", path="model.bin")}, "manifest"),
        "total-size": ("rolling", uri, {"size_bytes": 1}, "size_bytes"),
    }
    for case, (klass, target, extra, mentions) in cases.items():
        with subtests.test(case=case):
            response = register(client, run["id"], 100, target, klass, **extra)
            body = assert_problem(response, 409, "step")
            assert mentions in body["detail"]
            assert client.get(f"/v1/checkpoints/{original['id']}").json() == original
            assert steps(client, run["id"]) == [100]


def test_steps_are_unique_per_run_not_globally(client: TestClient, data_dir: Path) -> None:
    a = make_run(client, "proj", "a")
    b = make_run(client, "proj", "b")
    uri_a = write_checkpoint(data_dir / "hot", "proj/a/step-100")
    uri_b = write_checkpoint(data_dir / "hot", "proj/b/step-100")

    ca = make_checkpoint(client, a["id"], 100, uri_a)
    cb = make_checkpoint(client, b["id"], 100, uri_b, "final")

    assert ca["id"] != cb["id"]
    assert [c["id"] for c in client.get(f"/v1/runs/{a['id']}/checkpoints").json()["items"]] == [
        ca["id"]
    ]
    assert [c["id"] for c in client.get(f"/v1/runs/{b['id']}/checkpoints").json()["items"]] == [
        cb["id"]
    ]


def test_register_on_an_unknown_run_is_404_and_writes_nothing(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-1")
    assert_problem(register(client, "run_missing", 1, uri), 404, "run_id")
    assert steps(client, run["id"]) == []
    assert_problem(client.get("/v1/runs/run_missing/checkpoints"), 404, "run_id")


def test_size_bytes_differing_from_the_manifest_is_422_and_writes_nothing(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-3", FILES)
    total = sum(len(d) for d in FILES.values())

    with_files = register(client, run["id"], 3, uri, files=entries(FILES), size_bytes=total + 1)
    listed = register(client, run["id"], 3, uri, size_bytes=total - 1)

    for response in (with_files, listed):
        body = assert_problem(response, 422, "size_bytes")
        assert str(total) in body["detail"]
    assert steps(client, run["id"]) == []
    assert make_checkpoint(client, run["id"], 3, uri, size_bytes=total)["size_bytes"] == total


def test_uncommitted_registration_reserves_the_step_in_writing(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    target = data_dir / "hot" / "proj/run-1/step-200"
    uri = f"file://{target.resolve()}"
    assert not target.exists()

    reserved = make_checkpoint(client, run["id"], 200, uri, committed=False)

    assert reserved["state"] == "writing"
    assert reserved["files"] is None
    assert reserved["size_bytes"] == 0
    assert reserved["tier"] == "hot"
    assert steps(client, run["id"], state="writing") == [200]
    again = register(client, run["id"], 200, uri, committed=False)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == reserved["id"]


@pytest.mark.parametrize("how", ["no-body", "empty-object", "files"])
def test_commit_turns_writing_into_active(
    client: TestClient, data_dir: Path, run: dict[str, Any], how: str
) -> None:
    target = data_dir / "hot" / "proj/run-1/step-200"
    reserved = make_checkpoint(
        client, run["id"], 200, f"file://{target.resolve()}", committed=False
    )
    write_checkpoint(data_dir / "hot", "proj/run-1/step-200", FILES)
    url = f"/v1/checkpoints/{reserved['id']}/commit"

    if how == "no-body":
        response = client.post(url)
    elif how == "empty-object":
        response = client.post(url, json={})
    else:
        response = client.post(url, json={"files": entries(FILES), "metrics": {"loss": 0.5}})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == reserved["id"]
    assert body["state"] == "active"
    assert body["size_bytes"] == sum(len(d) for d in FILES.values())
    expected = entries(FILES, checksums=how == "files")
    assert body["files"] == sorted(expected, key=lambda e: e["path"])
    assert body["metrics"] == ({"loss": 0.5} if how == "files" else {})
    assert client.get(f"/v1/checkpoints/{reserved['id']}").json() == body

    repeated = client.post(url, json={})
    assert repeated.status_code == 200, repeated.text
    assert repeated.json() == body


def test_commit_refusals_leave_the_checkpoint_writing(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    target = data_dir / "hot" / "proj/run-1/step-9"
    reserved = make_checkpoint(client, run["id"], 9, f"file://{target.resolve()}", committed=False)
    url = f"/v1/checkpoints/{reserved['id']}/commit"

    assert_problem(client.post(url, json={}), 422, "uri")  # nothing there yet
    assert_problem(client.post(url, json={"files": entries(FILES)}), 422, "uri")
    write_checkpoint(data_dir / "hot", "proj/run-1/step-9", FILES)
    assert_problem(client.post(url, json={"size_bytes": 1}), 422, "size_bytes")
    assert_problem(client.post("/v1/checkpoints/ckpt_missing/commit", json={}), 404)

    assert client.get(f"/v1/checkpoints/{reserved['id']}").json() == reserved


def test_committing_again_with_another_manifest_is_409(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-4", FILES)
    active = make_checkpoint(client, run["id"], 4, uri)

    response = client.post(
        f"/v1/checkpoints/{active['id']}/commit",
        json={"files": [{"path": "other.pt", "size_bytes": 1}]},
    )

    assert_problem(response, 409, "files")
    assert client.get(f"/v1/checkpoints/{active['id']}").json() == active


def test_a_committed_reregistration_commits_a_reserved_step(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    target = data_dir / "hot" / "proj/run-1/step-300"
    uri = f"file://{target.resolve()}"
    reserved = make_checkpoint(client, run["id"], 300, uri, committed=False)
    write_checkpoint(data_dir / "hot", "proj/run-1/step-300", FILES)

    response = register(client, run["id"], 300, uri)

    assert response.status_code == 200, response.text
    assert response.json()["id"] == reserved["id"]
    assert response.json()["state"] == "active"
    assert response.json()["size_bytes"] == sum(len(d) for d in FILES.values())


def test_list_is_newest_step_first_with_every_state_and_filters(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    for step, klass in [(300, "rolling"), (100, "milestone"), (200, "rolling"), (50, "final")]:
        uri = write_checkpoint(data_dir / "hot", f"proj/run-1/step-{step}")
        make_checkpoint(client, run["id"], step, uri, klass)
    pending = data_dir / "hot" / "proj/run-1/step-400"
    make_checkpoint(client, run["id"], 400, f"file://{pending.resolve()}", committed=False)

    assert steps(client, run["id"]) == [400, 300, 200, 100, 50]
    assert steps(client, run["id"], **{"class": "rolling"}) == [400, 300, 200]
    assert steps(client, run["id"], **{"class": "milestone"}) == [100]
    assert steps(client, run["id"], **{"class": "custom-eval"}) == []
    assert steps(client, run["id"], state="active") == [300, 200, 100, 50]
    assert steps(client, run["id"], state="writing") == [400]
    assert steps(client, run["id"], state="trashed") == []
    assert steps(client, run["id"], state="active", **{"class": "rolling"}) == [300, 200]


def test_steps_order_numerically_not_by_name(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    """`checkpoint-10000` sorts before `checkpoint-9000` as text; the newest must come first."""
    for step in (9000, 10000, 999, 100000, 9999):
        uri = write_checkpoint(data_dir / "hot", f"proj/run-1/checkpoint-{step}")
        make_checkpoint(client, run["id"], step, uri)

    assert steps(client, run["id"]) == [100000, 10000, 9999, 9000, 999]
    paged, _ = list_all(client, f"/v1/runs/{run['id']}/checkpoints", limit=2)
    assert [c["step"] for c in paged] == [100000, 10000, 9999, 9000, 999]


def test_the_largest_step_is_accepted(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-max")
    biggest = make_checkpoint(client, run["id"], 2**63 - 1, uri)
    zero = make_checkpoint(client, run["id"], 0, write_checkpoint(data_dir / "hot", "z/step-0"))

    assert biggest["step"] == 2**63 - 1
    assert steps(client, run["id"]) == [2**63 - 1, 0]
    paged, pages = list_all(client, f"/v1/runs/{run['id']}/checkpoints", limit=1)
    assert [c["id"] for c in paged] == [biggest["id"], zero["id"]]
    assert pages == 2


def test_get_shows_locations_and_tier(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    uri = write_checkpoint(data_dir / "cold", "proj/run-1/step-8")
    created = make_checkpoint(client, run["id"], 8, uri, "final")

    body = client.get(f"/v1/checkpoints/{created['id']}").json()

    assert body["tier"] == "cold"
    assert body["locations"] == [
        {"tier": "cold", "uri": uri, "storage_class": None, "role": "primary"}
    ]
    assert_problem(client.get("/v1/checkpoints/ckpt_missing"), 404, "checkpoint_id")


def test_pin_and_unpin(client: TestClient, data_dir: Path, run: dict[str, Any]) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-10")
    created = make_checkpoint(client, run["id"], 10, uri)
    pin_url = f"/v1/checkpoints/{created['id']}/pin"

    pinned = client.post(pin_url, json={"reason": "paper figure 3"})
    assert pinned.status_code == 200, pinned.text
    assert (pinned.json()["pinned"], pinned.json()["pin_reason"]) == (True, "paper figure 3")
    assert client.get(f"/v1/checkpoints/{created['id']}").json() == pinned.json()

    repinned = client.post(pin_url, json={"reason": "release candidate"})
    assert repinned.json()["pin_reason"] == "release candidate"

    unpinned = client.delete(pin_url)
    assert unpinned.status_code == 200, unpinned.text
    assert (unpinned.json()["pinned"], unpinned.json()["pin_reason"]) == (False, None)
    assert client.get(f"/v1/checkpoints/{created['id']}").json() == created
    assert client.delete(pin_url).status_code == 200  # unpinning twice is fine


def test_pin_refusals(client: TestClient, data_dir: Path, run: dict[str, Any]) -> None:
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-10")
    created = make_checkpoint(client, run["id"], 10, uri)
    pin_url = f"/v1/checkpoints/{created['id']}/pin"

    assert_problem(client.post(pin_url, json={}), 422, "reason")
    assert_problem(client.post(pin_url, json={"reason": ""}), 422, "reason")
    assert_problem(client.post(pin_url, json={"reason": "x", "until": "never"}), 422, "until")
    assert_problem(client.post("/v1/checkpoints/ckpt_missing/pin", json={"reason": "x"}), 404)
    assert_problem(client.delete("/v1/checkpoints/ckpt_missing/pin"), 404)
    assert client.get(f"/v1/checkpoints/{created['id']}").json()["pinned"] is False
