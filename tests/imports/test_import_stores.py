"""Adopting a tree from each kind of store: a local directory, S3 (moto's server and
`rclone serve s3`) and GCS (fake-gcs-server), each on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.imports.trees import (
    Tree,
    all_items,
    catalog,
    hf_tree,
    megatron_tree,
    run_import,
)
from tests.integration.stores import Store

KINDS = ("local", "moto", "rclone", "gcs")


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, data_dir: Any) -> Store:
    kind = request.param
    if kind in ("moto", "rclone"):
        return Store("s3", data_dir, s3=request.getfixturevalue(f"{kind}_s3"))
    if kind == "gcs":
        return Store("gcs", data_dir, gs=request.getfixturevalue("fake_gcs"))
    return Store("local", data_dir)


@pytest.fixture
def settings(settings: Settings, store: Store) -> Settings:
    return store.settings(settings)


def legacy_tree() -> Tree:
    tree = hf_tree("team/outputs/mistral", [500, 1000]) | megatron_tree("team/gpt", [2000])
    tree["team/lightning/epoch=1-step=300.ckpt"] = b"L" * 33
    tree["team/lightning/last.ckpt"] = b"L" * 33
    tree["team/jax/7.orbax-checkpoint-tmp-99/state/array"] = b"a"
    return tree


def test_a_tree_is_adopted_from_every_store(app: FastAPI, client: TestClient, store: Store) -> None:
    tree = legacy_tree()
    for key, content in tree.items():
        store.put("hot", f"legacy/{key}", content)
    uri = store.uri("hot", "legacy")
    before = datetime.now(UTC) - timedelta(minutes=5)

    dry = run_import(app, client, uri=uri, project="adopt", dry_run=True)
    assert dry["state"] == "done", dry["error"]
    assert catalog(client, "adopt") == {}
    real = run_import(app, client, uri=uri, project="adopt")
    assert real["state"] == "done", real["error"]
    planned, registered = all_items(client, dry["id"]), all_items(client, real["id"])
    assert [dict(i, checkpoint_id=None) for i in registered] == planned
    assert sorted((i["run"], i["step"], i["layout"]) for i in registered) == [
        ("gpt", 2000, "megatron"),
        ("lightning", 300, "lightning"),
        ("mistral", 500, "hf"),
        ("mistral", 1000, "hf"),
    ]
    assert [i["key"] for i in real["incomplete"]] == ["team/jax/7.orbax-checkpoint-tmp-99"]
    assert real["unrecognized"] == 2  # last.ckpt, megatron's latest_checkpointed_iteration

    found = catalog(client, "adopt")
    mistral = found[("mistral", 1000)]
    assert mistral["uri"] == f"{uri}/team/outputs/mistral/checkpoint-1000"
    assert mistral["metrics"] == {"eval_loss": 0.002}
    assert mistral["tier"] == "hot" and mistral["state"] == "active"
    sizes = {f["path"]: f["size_bytes"] for f in mistral["files"]}
    prefix = "team/outputs/mistral/checkpoint-1000/"
    assert sizes == {k[len(prefix) :]: len(v) for k, v in tree.items() if k.startswith(prefix)}
    if store.kind == "gcs":  # the provider's checksums, where its listing gives them
        assert all("crc32c" in f for f in mistral["files"])
    created = datetime.fromisoformat(mistral["created_at"].replace("Z", "+00:00"))
    assert created >= before  # the objects were written just now

    again = run_import(app, client, uri=uri, project="adopt")
    assert (again["registered"], again["existing"]) == (0, 4)
    assert len(catalog(client, "adopt")) == 4
