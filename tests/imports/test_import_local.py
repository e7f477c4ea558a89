"""Adopting a tree on a local tier: every layout of DESIGN section 14, the dry run, the
second import, and what the runs and checkpoints look like once adopted."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.services.lifecycle import importer
from tests.builders import assert_problem
from tests.imports.trees import (
    Tree,
    all_items,
    catalog,
    deepspeed_tree,
    generic_tree,
    hf_tree,
    megatron_tree,
    run_import,
    stamp,
    write_local,
)


def mixed_tree() -> Tree:
    tree: Tree = {}
    tree |= hf_tree("outputs/llama-7b", [100, 200])
    tree |= megatron_tree("megatron/GPT 3 (ablation)", [1000])
    tree |= deepspeed_tree("ds/run-a/checkpoints", [5, 10])
    tree |= generic_tree("generic/exp1", [1, 2])
    tree |= generic_tree("generic/exp2", [7], dash=False)
    tree["lightning/my-run/checkpoints/epoch=0-step=50.ckpt"] = b"L" * 30
    tree["lightning/my-run/checkpoints/last.ckpt"] = b"L" * 30
    tree["orbax/jax-run/3/_CHECKPOINT_METADATA"] = b"{}"
    tree["orbax/jax-run/3/default/array.bin"] = b"a" * 20
    tree["orbax/jax-run/4.orbax-checkpoint-tmp-17/default/array.bin"] = b"a" * 20
    tree["dcp/titan/checkpoint/step-10/.metadata"] = b"meta"
    tree["dcp/titan/checkpoint/step-10/__0_0.distcp"] = b"x" * 60
    tree["broken/checkpoint-9/model.safetensors"] = b"w"  # no trainer_state.json
    tree["README.md"] = b"notes"
    return tree


def test_a_mixed_tree_is_adopted_with_every_layout(
    app: FastAPI, client: TestClient, data_dir: Path
) -> None:
    hot = data_dir / "hot"
    write_local(hot / "legacy", mixed_tree(), mtime=stamp(2025, 3, 1))
    uri = f"file://{hot}/legacy"

    dry = run_import(app, client, uri=uri, project="adopt", dry_run=True)
    assert dry["state"] == "done", dry
    assert catalog(client, "adopt") == {}
    planned = all_items(client, dry["id"], limit=3)

    real = run_import(app, client, uri=uri, project="adopt")
    assert real["state"] == "done", real
    registered = all_items(client, real["id"])
    strip = [{k: v for k, v in i.items() if k != "checkpoint_id"} for i in registered]
    assert strip == [{k: v for k, v in i.items() if k != "checkpoint_id"} for i in planned]

    by_layout = {(i["run"], i["step"]): i["layout"] for i in registered}
    assert by_layout == {
        ("titan", 10): "dcp",
        ("run-a", 5): "deepspeed",
        ("run-a", 10): "deepspeed",
        ("exp1", 1): "generic",
        ("exp1", 2): "generic",
        ("exp2", 7): "generic",
        ("my-run", 50): "lightning",
        ("gpt-3--ablation-", 1000): "megatron",
        ("jax-run", 3): "orbax",
        ("llama-7b", 100): "hf",
        ("llama-7b", 200): "hf",
    }
    assert real["discovered"] == 11 and real["registered"] == 11 and real["existing"] == 0
    assert real["runs"] == 8
    assert {i["key"]: i["reason"] for i in real["incomplete"]} == {
        "broken/checkpoint-9": "no trainer_state.json",
        "orbax/jax-run/4.orbax-checkpoint-tmp-17": (
            "an orbax save that never finished (a temporary directory)"
        ),
    }
    # README.md, last.ckpt (an alias), megatron's and deepspeed's pointers
    assert real["unrecognized"] == 4
    assert sorted(dry["unrecognized_keys"]) == [
        "README.md",
        "ds/run-a/checkpoints/latest",
        "lightning/my-run/checkpoints/last.ckpt",
        "megatron/GPT 3 (ablation)/latest_checkpointed_iteration.txt",
    ]

    found = catalog(client, "adopt")
    assert set(found) == set(by_layout)
    hf = found[("llama-7b", 200)]
    assert hf["state"] == "active" and hf["class"] == "milestone"
    assert hf["uri"] == f"{uri}/outputs/llama-7b/checkpoint-200"
    assert hf["metrics"] == {"eval_loss": 0.01}
    assert {f["path"] for f in hf["files"]} == {
        "model.safetensors",
        "optimizer.pt",
        "trainer_state.json",
    }
    assert hf["size_bytes"] == sum(f["size_bytes"] for f in hf["files"])
    assert hf["created_at"].startswith("2025-03-01T00:00:00")
    assert found[("llama-7b", 100)]["metrics"] == {"eval_loss": 0.02}
    lightning = found[("my-run", 50)]
    assert lightning["uri"] == f"{uri}/lightning/my-run/checkpoints/epoch=0-step=50.ckpt"
    assert [f["path"] for f in lightning["files"]] == ["epoch=0-step=50.ckpt"]

    runs = {
        r["name"]: r for r in client.get("/v1/runs", params={"project": "adopt"}).json()["items"]
    }
    megatron = runs["gpt-3--ablation-"]
    assert megatron["labels"]["import_path"] == f"{uri}/megatron/GPT 3 (ablation)"
    assert runs["run-a"]["labels"]["import_path"] == f"{uri}/ds/run-a"
    for run in runs.values():
        assert run["status"] == "completed"
        assert run["ended_at"].startswith("2025-03-01T00:00:00")

    again = run_import(app, client, uri=uri, project="adopt")
    assert again["state"] == "done"
    assert (again["registered"], again["existing"], again["discovered"]) == (0, 11, 11)
    assert all_items(client, again["id"]) == []
    assert len(catalog(client, "adopt")) == 11


def test_layout_class_run_and_active_are_the_callers(
    app: FastAPI, client: TestClient, data_dir: Path
) -> None:
    hot = data_dir / "hot"
    write_local(hot / "t", generic_tree("a", [1, 2]) | hf_tree("b", [3]))
    uri = f"file://{hot}/t"
    answer = run_import(
        app,
        client,
        uri=uri,
        project="p",
        layout="generic",
        run="together",
        active=True,
        **{"class": "rolling"},
    )
    assert answer["state"] == "done" and answer["registered"] == 2
    found = catalog(client, "p")
    assert set(found) == {("together", 1), ("together", 2)}
    assert {c["class"] for c in found.values()} == {"rolling"}
    run = client.get("/v1/runs", params={"project": "p"}).json()["items"][0]
    assert run["status"] == "active" and run["ended_at"] is None
    assert answer["unrecognized"] == 3  # hf's files under a generic-only import


def test_a_large_import_is_evaluated_against_fresh_statistics(
    app: FastAPI, client: TestClient, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an import has registered many checkpoints (here, with the threshold lowered,
    three), PostgreSQL's statistics of the catalog are refreshed before the evaluation plans
    its queries against them, the small `projects` included (autovacuum leaves a table of
    a few rows unanalyzed); an import below the threshold leaves them be."""
    hot = data_dir / "hot"
    write_local(hot / "small", generic_tree("a", [1, 2]))
    write_local(hot / "large", generic_tree("b", [1, 2, 3]))
    monkeypatch.setattr(importer, "ANALYZE_AFTER", 3)
    engine = app.state.engine

    tables = ("checkpoints", "locations", "runs", "projects")

    def analyzed() -> dict[str, datetime | None]:
        if engine.dialect.name != "postgresql":
            return {}
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT relname, last_analyze FROM pg_stat_user_tables"),
            ).all()
        return {name: last for name, last in rows if name in tables}

    before = analyzed()
    small = run_import(app, client, uri=f"file://{hot}/small", project="p")
    assert small["state"] == "done" and small["registered"] == 2
    assert analyzed() == before
    large = run_import(app, client, uri=f"file://{hot}/large", project="p")
    assert large["state"] == "done" and large["registered"] == 3
    after = analyzed()
    if engine.dialect.name == "postgresql":
        for table in tables:
            was, now = before.get(table), after.get(table)
            assert now is not None and (was is None or now > was), table


def test_a_uri_under_no_tier_is_422_and_a_missing_tree_404(
    client: TestClient, data_dir: Path, tmp_path: Path
) -> None:
    outside = client.post("/v1/imports", json={"uri": f"file://{tmp_path}/x", "project": "p"})
    assert_problem(outside, 422, "uri")
    missing = client.post(
        "/v1/imports", json={"uri": f"file://{data_dir}/hot/nothing", "project": "p"}
    )
    assert_problem(missing, 404, "uri")
    bad = client.post(
        "/v1/imports",
        json={"uri": f"file://{data_dir}/hot", "project": "p", "layout": "keras"},
    )
    assert_problem(bad, 422, "layout")
    assert client.get("/v1/imports").json()["items"] == []


def test_a_tree_inside_a_catalogued_checkpoint_is_refused(
    app: FastAPI, client: TestClient, data_dir: Path
) -> None:
    hot = data_dir / "hot"
    write_local(hot / "t", generic_tree("a", [1]))
    first = run_import(app, client, uri=f"file://{hot}/t", project="p")
    assert first["registered"] == 1
    inside = client.post("/v1/imports", json={"uri": f"file://{hot}/t/a/step-1", "project": "p"})
    assert_problem(inside, 409, "uri")


def test_a_checkpoint_overlapping_a_catalogued_one_is_skipped_and_reported(
    app: FastAPI, client: TestClient, data_dir: Path
) -> None:
    hot = data_dir / "hot"
    write_local(hot / "t", generic_tree("exp", [1, 2]))
    run = client.post("/v1/runs", json={"project": "p", "name": "other"}).json()
    held = client.post(
        f"/v1/runs/{run['id']}/checkpoints",
        json={"step": 9, "class": "rolling", "uri": f"file://{hot}/t/exp/step-2/meta.json"},
    )
    assert held.status_code == 201, held.text
    answer = run_import(app, client, uri=f"file://{hot}/t", project="p")
    assert answer["registered"] == 1
    assert [s["key"] for s in answer["skipped"]] == ["exp/step-2"]
    assert "contains the location of" in answer["skipped"][0]["reason"]
    assert set(catalog(client, "p")) == {("exp", 1), ("other", 9)}
    assert datetime.now(UTC).year >= 2026
