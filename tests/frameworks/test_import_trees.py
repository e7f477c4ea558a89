"""Importing trees the real frameworks wrote before any catalog knew them (DESIGN section
14): Lightning, the Hugging Face Trainer, torch.distributed.checkpoint and orbax, each
with its own API only (tests/frameworks/scripts/legacy_trees.py, the frameworks'
Python), into one directory of the `hot` tier of a real `ckpt serve`, then adopted through
the HTTP API: a dry run, the import, and the same import again."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.conftest import Service
from tests.frameworks.conftest import Training
from tests.frameworks.support import poll

SCRIPT = Path(__file__).resolve().parent / "scripts" / "legacy_trees.py"
IMPORT_DEADLINE = 120.0
EVERY = 2
LIGHTNING_STEPS, HF_STEPS, ORBAX_STEPS = 8, 6, 6
DCP_SAVES = [2, 4, 6, 8]
DCP_TORN = 8  # its .metadata removed afterwards: a save that never finished
RUNS = {"lightning": "Lightning_Run", "hf": "GPT2 Tiny", "dcp": "titan-run", "orbax": "jax-run"}
ORBAX_TMP_MARK = ".orbax-checkpoint-tmp-"


def normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]", "-", name.lower())


@dataclass
class Tree:
    root: Path
    uri: str
    project: str

    def run_dir(self, framework: str) -> Path:
        return self.root / RUNS[framework]


@dataclass
class Imports:
    dry: dict[str, Any]
    real: dict[str, Any]
    again: dict[str, Any]
    dry_items: list[dict[str, Any]]
    real_items: list[dict[str, Any]]
    again_items: list[dict[str, Any]]
    dcp_only: dict[str, Any]  # the dcp run's directory, layout "dcp", dry


def files_under(directory: Path) -> dict[str, int]:
    return {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file()
    }


def newest_mtime(path: Path) -> datetime:
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return datetime.fromtimestamp(max(p.stat().st_mtime for p in paths), UTC)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def tree(
    frameworks_python: Path, service: Service, tmp_path_factory: pytest.TempPathFactory
) -> Tree:
    """The four frameworks' trees side by side under one directory of `hot`, each in a
    run directory of its own; the dcp run's last step torn (no .metadata), and an orbax
    temporary directory left behind (a finished step's copy under orbax's in-progress
    name: what a save killed before its rename leaves)."""
    training = Training(frameworks_python, service, tmp_path_factory.mktemp("legacy") / "spool")
    root = service.tier_dir("hot") / f"legacy-{uuid.uuid4().hex[:8]}"
    legacy = Tree(root, f"file://{root}", f"p-{uuid.uuid4().hex[:12]}")
    steps = ("--max-steps", "--every", str(EVERY))
    lightning_dir = legacy.run_dir("lightning") / "checkpoints"
    training.run(
        SCRIPT, "lightning", str(lightning_dir), steps[0], str(LIGHTNING_STEPS), *steps[1:]
    )
    training.run(SCRIPT, "hf", str(legacy.run_dir("hf")), steps[0], str(HF_STEPS), *steps[1:])
    dcp_dir = legacy.run_dir("dcp") / "checkpoint"
    training.run(SCRIPT, "dcp", str(dcp_dir), "--save-at", ",".join(map(str, DCP_SAVES)))
    (dcp_dir / f"step-{DCP_TORN}" / ".metadata").unlink()
    orbax_dir = legacy.run_dir("orbax")
    training.run(SCRIPT, "orbax", str(orbax_dir), steps[0], str(ORBAX_STEPS), *steps[1:])
    unfinished = ORBAX_STEPS + EVERY
    shutil.copytree(orbax_dir / str(ORBAX_STEPS), orbax_dir / f"{unfinished}{ORBAX_TMP_MARK}1")
    return legacy


def start(admin: httpx.Client, **body: Any) -> str:
    answer = admin.post("/v1/imports", json=body)
    assert answer.status_code == 202, answer.text
    import_id: str = answer.json()["id"]
    return import_id


def finished(admin: httpx.Client, import_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        answer = admin.get(f"/v1/imports/{import_id}")
        assert answer.status_code == 200, answer.text
        document: dict[str, Any] = answer.json()
        return document if document["state"] != "running" else None

    document = poll(f"import {import_id} is over", done, IMPORT_DEADLINE)
    assert document["state"] == "done", document
    return document


def items(admin: httpx.Client, import_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 5}  # a few pages
    while True:
        page = admin.get(f"/v1/imports/{import_id}", params=params).json()
        found.extend(page["items"])
        if page["next_cursor"] is None:
            return found
        params["cursor"] = page["next_cursor"]


@pytest.fixture(scope="module")
def imports(service: Service, tree: Tree) -> Iterator[Imports]:
    with service.admin() as admin:
        body = {"uri": tree.uri, "project": tree.project}
        dry = finished(admin, start(admin, **body, dry_run=True))
        dry_items = items(admin, dry["id"])
        assert admin.get("/v1/runs", params={"project": tree.project}).json()["items"] == []
        real = finished(admin, start(admin, **body))
        real_items = items(admin, real["id"])
        again = finished(admin, start(admin, **body))
        again_items = items(admin, again["id"])
        dcp_uri = f"{tree.uri}/{RUNS['dcp']}"
        dcp_only = finished(
            admin, start(admin, uri=dcp_uri, project=tree.project, layout="dcp", dry_run=True)
        )
        yield Imports(dry, real, again, dry_items, real_items, again_items, dcp_only)


def expected(tree: Tree) -> dict[tuple[str, int], tuple[str, Path]]:
    """(run, step) -> (layout, path) of what the frameworks left complete on disk."""
    found: dict[tuple[str, int], tuple[str, Path]] = {}
    lightning = tree.run_dir("lightning") / "checkpoints"
    for path in lightning.glob("*.ckpt"):
        matched = re.fullmatch(r"epoch=\d+-step=(\d+)\.ckpt", path.name)
        if matched:
            found[(normalised(RUNS["lightning"]), int(matched.group(1)))] = ("lightning", path)
    for path in tree.run_dir("hf").glob("checkpoint-*"):
        found[(normalised(RUNS["hf"]), int(path.name.split("-")[1]))] = ("hf", path)
    for path in (tree.run_dir("dcp") / "checkpoint").glob("step-*"):
        layout = "dcp" if (path / ".metadata").exists() else "generic"
        found[(RUNS["dcp"], int(path.name.split("-")[1]))] = (layout, path)
    for path in tree.run_dir("orbax").iterdir():
        if path.name.isdigit() and (path / "_CHECKPOINT_METADATA").exists():
            found[(RUNS["orbax"], int(path.name))] = ("orbax", path)
    return found


def test_the_frameworks_wrote_what_they_were_asked(tree: Tree) -> None:
    """The trees themselves, so that what the imports are held to below is what these
    framework versions really write."""
    want = expected(tree)
    lightning = normalised(RUNS["lightning"])
    saves = set(range(EVERY, LIGHTNING_STEPS + 1, EVERY))
    assert {s for (r, s) in want if r == lightning} == saves
    assert (tree.run_dir("lightning") / "checkpoints" / "last.ckpt").is_file()
    hf_saves = set(range(EVERY, HF_STEPS + 1, EVERY))
    assert {s for (r, s) in want if r == normalised(RUNS["hf"])} == hf_saves
    assert {s for (r, s) in want if r == RUNS["dcp"]} == set(DCP_SAVES)
    orbax_saves = set(range(EVERY, ORBAX_STEPS + 1, EVERY))
    assert {s for (r, s) in want if r == RUNS["orbax"]} == orbax_saves


def test_each_run_gets_exactly_the_steps_its_framework_wrote_with_their_layout(
    tree: Tree, imports: Imports
) -> None:
    want = expected(tree)
    got = {(i["run"], i["step"]): (i["layout"], i["uri"]) for i in imports.real_items}
    assert got == {k: (layout, f"file://{path}") for k, (layout, path) in want.items()}
    real = imports.real
    assert (real["discovered"], real["registered"], real["existing"]) == (len(want), len(want), 0)
    assert real["runs"] == len(RUNS) and real["skipped"] == [] and real["error"] is None
    assert real["registered_bytes"] == sum(i["size_bytes"] for i in imports.real_items)
    # a torn dcp save (no .metadata) under layout auto: a generic checkpoint
    assert want[(RUNS["dcp"], DCP_TORN)][0] == "generic"


def test_lightnings_last_ckpt_is_an_alias_never_registered(imports: Imports) -> None:
    assert not any(i["uri"].endswith("/last.ckpt") for i in imports.real_items)
    last = f"{RUNS['lightning']}/checkpoints/last.ckpt"
    assert last in imports.dry["unrecognized_keys"]
    assert imports.real["unrecognized"] == imports.dry["unrecognized"] >= 1


def test_an_unfinished_orbax_save_is_reported_incomplete(imports: Imports) -> None:
    unfinished = f"{RUNS['orbax']}/{ORBAX_STEPS + EVERY}{ORBAX_TMP_MARK}1"
    for document in (imports.dry, imports.real):
        assert [i["key"] for i in document["incomplete"]] == [unfinished], document
        assert "never finished" in document["incomplete"][0]["reason"]
    assert not any(ORBAX_TMP_MARK in i["uri"] for i in imports.real_items)


def test_a_dcp_step_without_metadata_is_incomplete_under_layout_dcp(
    tree: Tree, imports: Imports
) -> None:
    only = imports.dcp_only
    assert only["incomplete"] == [
        {"key": f"checkpoint/step-{DCP_TORN}", "reason": "no .metadata"}
    ], only
    complete = [s for s in DCP_SAVES if s != DCP_TORN]
    # the complete ones are the catalog's already (the import above took them)
    assert (only["discovered"], only["existing"], only["registered"]) == (
        len(complete),
        len(complete),
        0,
    )


def test_the_dry_run_lists_what_the_import_registers(imports: Imports) -> None:
    def plain(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in i.items() if k != "checkpoint_id"} for i in found]

    assert plain(imports.dry_items) == plain(imports.real_items)
    assert all(i["checkpoint_id"] is None for i in imports.dry_items)
    assert all(i["checkpoint_id"] for i in imports.real_items)
    for counter in ("listed", "discovered", "registered", "runs", "unrecognized"):
        assert imports.dry[counter] == imports.real[counter], counter


def test_importing_the_tree_again_registers_nothing(imports: Imports) -> None:
    again = imports.again
    assert again["registered"] == 0 and imports.again_items == []
    assert again["existing"] == again["discovered"] == imports.real["discovered"]
    assert again["runs"] == 0


def test_the_catalog_holds_the_adopted_checkpoints_as_the_frameworks_left_them(
    service: Service, tree: Tree, imports: Imports
) -> None:
    want = expected(tree)
    ids = {(i["run"], i["step"]): i["checkpoint_id"] for i in imports.real_items}
    with service.admin() as admin:
        runs = admin.get("/v1/runs", params={"project": tree.project, "limit": 100}).json()
        by_name = {r["name"]: r for r in runs["items"]}
        assert set(by_name) == {normalised(name) for name in RUNS.values()}
        for framework, directory in RUNS.items():
            run = by_name[normalised(directory)]
            assert run["status"] == "completed", run
            assert run["labels"]["import_path"] == f"{tree.uri}/{directory}", (framework, run)
            page = admin.get(f"/v1/runs/{run['id']}/checkpoints", params={"limit": 500}).json()
            for checkpoint in page["items"]:
                key = (run["name"], checkpoint["step"])
                layout, path = want.pop(key)
                assert checkpoint["id"] == ids[key]
                assert checkpoint["state"] == "active" and checkpoint["class"] == "milestone"
                assert checkpoint["uri"] == f"file://{path}"
                manifest = {f["path"]: f["size_bytes"] for f in checkpoint["files"]}
                on_disk = {path.name: path.stat().st_size} if path.is_file() else files_under(path)
                assert manifest == on_disk, key
                assert checkpoint["size_bytes"] == sum(on_disk.values())
                assert parse_time(checkpoint["created_at"]) == newest_mtime(path), key
                if layout == "hf":
                    state = json.loads((path / "trainer_state.json").read_text())
                    (logged,) = [
                        e
                        for e in state["log_history"]
                        if e.get("step") == checkpoint["step"] and "eval_loss" in e
                    ]
                    assert checkpoint["metrics"]["eval_loss"] == logged["eval_loss"], key
                    evals = {k: v for k, v in logged.items() if k.startswith("eval_")}
                    assert checkpoint["metrics"] == evals, key
    assert want == {}, f"not in the catalog: {sorted(want)}"
