"""A client generated from the OpenAPI document calls every operation of it.

openapi-python-client writes a typed client from the app's own document into a temporary
directory; the test imports it and drives the live app through it (its httpx client is the
app's test client), from an empty catalog to a revoked token. A document that a generator
cannot read, an operation it skips, a body it cannot build or an answer it cannot parse
fails here."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.builders import ago, bearer, file_entries, iso, step_dir, step_files, write_checkpoint

PACKAGE = "ckpt_generated"
GENERATOR = Path(sys.executable).with_name("openapi-python-client")

POLICY = {
    "rules": [
        {"name": "rolling", "class": "rolling", "keep_last": 5, "action": "delete"},
        {"name": "finals", "class": "final", "action": {"copy_to": "archive"}},
    ]
}


@pytest.fixture
def generated(auth_app: FastAPI, tmp_path: Path) -> Iterator[ModuleType]:
    """The generated package, imported; forgotten again afterwards (each test has its own
    document: the tiers' urls are in it)."""
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(auth_app.openapi()))
    config = tmp_path / "generator.yaml"
    config.write_text(
        f"project_name_override: ckpt-generated\npackage_name_override: {PACKAGE}\npost_hooks: []\n"
    )
    out = tmp_path / "client"
    done = subprocess.run(
        [GENERATOR, "generate", "--path", spec, "--output-path", out, "--config", config],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout.replace("WARNING parsing PUT /v1/policies", ""), done.stdout
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


class Caller:
    """Calls an operation, named by method and path, through its generated module."""

    def __init__(self, package: ModuleType, document: dict[str, Any], http: TestClient) -> None:
        self.package = package
        self.document = document
        client_module = importlib.import_module(f"{PACKAGE}.client")
        self.client = client_module.Client(base_url="http://testserver")
        self.client.set_httpx_client(http)
        self.models = importlib.import_module(f"{PACKAGE}.models")
        self.called: set[tuple[str, str]] = set()

    def model(self, name: str, data: dict[str, Any]) -> Any:
        return getattr(self.models, name).from_dict(data)

    def __call__(self, method: str, path: str, expect: int, **kwargs: Any) -> Any:
        operation = self.document["paths"][path][method.lower()]
        name = re.sub("_+", "_", operation["operationId"])  # the generator's module name
        module = importlib.import_module(f"{PACKAGE}.api.{operation['tags'][0]}.{name}")
        response = module.sync_detailed(client=self.client, **kwargs)
        assert response.status_code == expect, (method, path, response.content[:500])
        self.called.add((method, path))
        return response.parsed


def test_a_generated_client_calls_every_operation(
    generated: ModuleType,
    auth_app: FastAPI,
    auth_client: TestClient,
    admin_secret: str,
    data_dir: Path,
) -> None:
    document = auth_app.openapi()
    http = TestClient(auth_app, base_url="http://testserver", headers=bearer(admin_secret))
    call = Caller(generated, document, http)
    m = call.model

    assert call("GET", "/healthz", 200).status == "ok"
    stored = call("PUT", "/v1/policies/{name}", 200, name="tiering", body=m("PolicyBody", POLICY))
    assert stored.name == "tiering"
    assert [p.name for p in call("GET", "/v1/policies", 200).items] == ["tiering"]
    assert call("GET", "/v1/policies/{name}", 200, name="tiering").name == "tiering"

    body = {"project": "gen", "name": "r1", "started_at": "2020-01-01T00:00:00Z"}
    run = call("POST", "/v1/runs", 201, body=m("RunCreate", {**body, "labels": {"team": "a"}}))
    assert [r.id for r in call("GET", "/v1/runs", 200, label=["team:a"]).items] == [run.id]
    assert call("GET", "/v1/runs/{run_id}", 200, run_id=run.id).name == "r1"
    fields = {"project": "gen", "name": "r1"}
    ids = []
    for step, committed in ((1, True), (2, False)):
        files = step_files(step)
        root = step_dir(data_dir, "hot", fields, step)
        uri = write_checkpoint(root.parent, root.name, files)
        registration = {
            "step": step,
            "class": "rolling",
            "uri": uri,
            "files": file_entries(files),
            "created_at": iso(ago(hours=1)),
            "committed": committed,
        }
        made = call(
            "POST",
            "/v1/runs/{run_id}/checkpoints",
            201,
            run_id=run.id,
            body=m("CheckpointCreate", registration),
        )
        ids.append(made.id)
    first, second = ids
    committed = call(
        "POST",
        "/v1/checkpoints/{checkpoint_id}/commit",
        200,
        checkpoint_id=second,
        body=m("CheckpointCommit", {}),
    )
    assert committed.state == "active"
    listed = call("GET", "/v1/runs/{run_id}/checkpoints", 200, run_id=run.id)
    assert [c.step for c in listed.items] == [2, 1]
    assert call("GET", "/v1/checkpoints/{checkpoint_id}", 200, checkpoint_id=first).tier == "hot"
    pin = m("PinCreate", {"reason": "paper"})
    assert call(
        "POST", "/v1/checkpoints/{checkpoint_id}/pin", 200, checkpoint_id=first, body=pin
    ).pinned
    assert not call(
        "DELETE", "/v1/checkpoints/{checkpoint_id}/pin", 200, checkpoint_id=first
    ).pinned
    relabel = m("CheckpointUpdate", {"labels": {"eval": "passed"}})
    patched = call(
        "PATCH", "/v1/checkpoints/{checkpoint_id}", 200, checkpoint_id=first, body=relabel
    )
    assert patched.labels.to_dict() == {"eval": "passed"}
    reservation = {
        "step": 3,
        "class": "rolling",
        "uri": f"file://{step_dir(data_dir, 'hot', fields, 3).resolve()}",
        "committed": False,
    }
    reserved = call(
        "POST",
        "/v1/runs/{run_id}/checkpoints",
        201,
        run_id=run.id,
        body=m("CheckpointCreate", reservation),
    )
    kept = call("POST", "/v1/checkpoints/{checkpoint_id}/keepalive", 200, checkpoint_id=reserved.id)
    assert kept.state == "writing" and kept.reserved_until is not None
    failed = m("AbortRequest", {"reason": "out of disk"})
    aborted = call(
        "POST", "/v1/checkpoints/{checkpoint_id}/abort", 200, checkpoint_id=reserved.id, body=failed
    )
    assert aborted.state == "trashed"

    plan = call("POST", "/v1/plan", 200, body=m("PlanRequest", {"run_id": run.id}))
    assert sorted(k.step for k in plan.kept) == [1, 2]
    sweep = call("POST", "/v1/sweeps", 202, body=m("SweepRequest", {"project": "gen"}))
    assert call("POST", "/v1/sweeps/{sweep_id}/approve", 200, sweep_id=sweep.id).id == sweep.id
    restore = call(
        "POST",
        "/v1/checkpoints/{checkpoint_id}/restore",
        202,
        checkpoint_id=first,
        body=m("RestoreRequest", {"tier": "cold"}),
    )
    assert (restore.kind, restore.step, restore.phase, restore.bytes_done) == (
        "restore",
        1,
        None,
        0,
    )
    assert [a.id for a in call("GET", "/v1/actions", 200, run_id=run.id).items] == [restore.id]
    assert call("GET", "/v1/actions/{action_id}", 200, action_id=restore.id).step == 1
    approved = call("POST", "/v1/actions/{action_id}/approve", 200, action_id=restore.id)
    assert approved.state == "pending"  # nothing held: approving changes nothing
    deleting = call("DELETE", "/v1/checkpoints/{checkpoint_id}", 202, checkpoint_id=second)
    assert (deleting.kind, deleting.step) == ("delete", 2)
    undelete = "/v1/checkpoints/{checkpoint_id}/undelete"
    assert call("POST", undelete, 200, checkpoint_id=second).state == "active"
    ended = call(
        "PATCH",
        "/v1/runs/{run_id}",
        200,
        run_id=run.id,
        body=m("RunUpdate", {"status": "completed"}),
    )
    assert ended.status == "completed"

    assert call("GET", "/v1/tiers", 200).items[0].name == "hot"
    assert call("GET", "/v1/reports/cost", 200).rows
    forecast = {"checkpoint_bytes": 10**9, "run_days": 3, "schedule": {"rolling": "6h"}}
    forecast_body = m("ForecastRequest", {**forecast, "policy": "tiering"})
    predicted = call("POST", "/v1/forecast", 200, body=forecast_body)
    assert (predicted.policy, predicted.run_days) == ("tiering", 3)
    replayed = call(
        "POST",
        "/v1/backtest",
        200,
        body=m("BacktestRequest", {"policy": "tiering", "project": "gen"}),
    )
    assert (replayed.policy, replayed.runs) == ("tiering", 1) and replayed.series
    sizing = call("POST", "/v1/planner", 200, body=m("PlannerRequest", {}))
    assert sizing.incomplete
    assert call("GET", "/v1/reconcile", 200).orphans == []
    nothing = m("OrphanDeleteRequestType0", {"orphans": []})  # the first of the two shapes
    assert call("POST", "/v1/reconcile/orphans/delete", 200, body=nothing).deleted == []
    assert call("GET", "/v1/audit", 200, run_id=run.id).items
    call("GET", "/metrics", 200)

    tree = f"file://{(data_dir / 'hot').resolve()}"
    dry = m("ImportCreate", {"uri": tree, "project": "gen", "dry_run": True})
    adopting = call("POST", "/v1/imports", 202, body=dry)
    assert adopting.dry_run and adopting.uri == tree
    assert adopting.id in [i.id for i in call("GET", "/v1/imports", 200).items]
    assert call("GET", "/v1/imports/{import_id}", 200, import_id=adopting.id).id == adopting.id

    grant = {"name": "reader", "scopes": ["read"], "projects": ["gen"]}
    token = call("POST", "/v1/tokens", 201, body=m("TokenCreate", grant))
    assert token.token and token.id in [t.id for t in call("GET", "/v1/tokens", 200).items]
    call("DELETE", "/v1/tokens/{token_id}", 204, token_id=token.id)
    shadowed = call("GET", "/v1/policies/{name}/shadow", 200, name="tiering")
    assert (shadowed.policy, shadowed.mode, shadowed.actions) == ("tiering", "enforce", [])
    call("DELETE", "/v1/policies/{name}", 204, name="tiering")

    everything = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert everything - call.called == set()
