"""Paths a job supplies are checked like paths the service lists, and an error that waiting
cannot heal fails its action at once, with its reason."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.storage.base import ArchivedObject, PermissionDenied, StorageError, is_permanent
from app.storage.s3 import translate
from tests.builders import (
    assert_problem,
    fetch_checkpoint,
    file_entries,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    register,
    step_dir,
    step_files,
    tree,
)


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    return make_run(client)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "secret.bin"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"secret!")
    return secret


def test_a_supplied_manifest_may_not_lead_outside_the_tier(
    client: TestClient, data_dir: Path, run: dict[str, Any], outside: Path
) -> None:
    root = data_dir / "hot" / "proj" / "run-1" / "step-501"
    (root / "sub").mkdir(parents=True)
    (root / "model.bin").symlink_to(outside)
    (root / "sub" / "deep").symlink_to(outside.parent, target_is_directory=True)
    uri = f"file://{root}"

    for path in ("model.bin", "sub/deep/secret.bin"):
        body = [{"path": path, "size_bytes": 7}]
        response = register(client, run["id"], 5, uri, files=body)
        assert_problem(response, 422, field="files")
        assert path in response.json()["detail"] and "symlink" in response.json()["detail"]
    assert client.get(f"/v1/runs/{run['id']}/checkpoints").json()["items"] == []


def test_a_symlink_that_stays_inside_the_tier_is_accepted(
    client: TestClient, data_dir: Path, run: dict[str, Any]
) -> None:
    shared = data_dir / "hot" / "shared" / "tokenizer.json"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"{}")
    root = data_dir / "hot" / "proj" / "run-1" / "step-6"
    root.mkdir(parents=True)
    (root / "tokenizer.json").symlink_to(shared)
    response = register(
        client, run["id"], 6, f"file://{root}", files=[{"path": "tokenizer.json", "size_bytes": 2}]
    )
    assert response.status_code == 201, response.text


def restore_and_drain(client: TestClient, app: FastAPI, checkpoint_id: str) -> dict[str, Any]:
    answer = client.post(f"/v1/checkpoints/{checkpoint_id}/restore", json={"tier": "warm"})
    assert answer.status_code == 202, answer.text
    make_executor(app, trash_retention=timedelta(days=7)).drain()
    (action,) = ledger(client, kind="restore")
    return action


def test_a_path_turned_unsafe_fails_the_action_at_once(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any], outside: Path
) -> None:
    checkpoint = place_checkpoint(client, data_dir, run, 10)
    victim = step_dir(data_dir, "hot", run, 10) / "shard-0.bin"
    victim.unlink()
    victim.symlink_to(outside)

    action = restore_and_drain(client, app, checkpoint["id"])

    assert (action["state"], action["attempts"]) == ("failed", 1)
    assert action["error"].startswith("UnsafePath")
    assert tree(step_dir(data_dir, "warm", run, 10)) == {}  # nothing copied is left
    assert [loc["tier"] for loc in fetch_checkpoint(client, checkpoint["id"])["locations"]] == [
        "hot"
    ]


def test_a_missing_source_fails_the_action_at_once(
    client: TestClient, app: FastAPI, data_dir: Path, run: dict[str, Any]
) -> None:
    files = step_files(10, n=3)
    checkpoint = place_checkpoint(client, data_dir, run, 10, files=files)
    os.unlink(step_dir(data_dir, "hot", run, 10) / "shard-2.bin")

    action = restore_and_drain(client, app, checkpoint["id"])

    assert (action["state"], action["attempts"]) == ("failed", 1)
    assert action["error"].startswith("ObjectMissing")
    assert tree(step_dir(data_dir, "warm", run, 10)) == {}  # no partial copy


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("AccessDenied", 403, PermissionDenied),  # rights, an object lock, a legal hold
        ("InvalidObjectState", 403, ArchivedObject),  # a 403 that a restore heals
        ("InternalError", 500, StorageError),
    ],
)
def test_s3_refusals_that_cannot_heal_are_permanent(
    code: str, status: int, expected: type[StorageError]
) -> None:
    response: Any = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    error = ClientError(
        response,
        "DeleteObject",
    )
    translated = translate(error, "DeleteObject s3://b/k")
    assert isinstance(translated, expected)
    assert is_permanent(translated) == (expected is PermissionDenied)


@pytest.mark.parametrize("where", ["key", "value"])
def test_nul_bytes_are_refused_in_labels(
    client: TestClient, data_dir: Path, run: dict[str, Any], where: str
) -> None:
    labels = {"team\x00": "a"} if where == "key" else {"team": "a\x00b"}
    body = {"project": "p", "name": "n", "labels": labels}
    refused = assert_problem(client.post("/v1/runs", json=body), 422)
    assert refused["detail"].endswith("must not contain NUL characters"), refused
    assert_problem(client.patch(f"/v1/runs/{run['id']}", json={"labels": labels}), 422)
    files = step_files(1)
    root = step_dir(data_dir, "hot", run, 1)
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    response = register(
        client, run["id"], 1, f"file://{root}", files=file_entries(files), labels=labels
    )
    assert_problem(response, 422)
    assert client.get("/v1/runs", params={"project": "p"}).json()["items"] == []
    assert client.get(f"/v1/runs/{run['id']}/checkpoints").json()["items"] == []
    assert client.get(f"/v1/runs/{run['id']}").json()["labels"] == {}
