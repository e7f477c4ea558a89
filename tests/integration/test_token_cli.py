"""`ckpt token create|list|revoke` as an operator runs them, and `ckpt serve` with access
control on: real processes, real environment."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from rich.cells import cell_len
from sqlalchemy import Engine, text

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import assert_problem, bearer, remember_secret
from tests.integration.test_cli import (
    CKPT,
    Served,
    ckpt_env,
    run_ckpt,
    wait_until_healthy,
)
from tests.storage.ports import free_port

Ckpt = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def ckpt(database_url: str, clean_engine: Engine, tmp_path: Path) -> Ckpt:
    """`ckpt ...` on the test database (emptied first)."""

    def run(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
        return run_ckpt(
            *args,
            cwd=tmp_path,
            CKPT_DATABASE_URL=database_url,
            CKPT_DATA_DIR=str(tmp_path / "data"),
            **cast(dict[str, Any], {"COLUMNS": "250", **variables}),
        )

    return run


@pytest.fixture
def served_app(auth_settings: Settings, clean_engine: Engine) -> Iterator[FastAPI]:
    app = create_app(auth_settings, engine=clean_engine, roles=NO_BACKGROUND)
    with TestClient(app):
        yield app


def test_token_create_list_revoke(ckpt: Ckpt, clean_engine: Engine, served_app: FastAPI) -> None:
    run = ckpt
    created = run(
        "token", "create", "trainer", "--scope", "register", "--project", "llama", LOGNAME="bob"
    )
    assert created.returncode == 0, created.stderr
    secret = remember_secret(created.stdout.strip())
    assert secret.startswith("ckpt_") and "\n" not in secret
    assert "not shown again" in created.stderr and secret not in created.stderr
    token_id = created.stderr.split()[2]
    assert token_id.startswith("tok_")
    with clean_engine.connect() as connection:
        stored = connection.execute(text("SELECT * FROM tokens")).all()
    assert secret not in str(stored)
    assert hashlib.sha256(secret.encode()).hexdigest() in str(stored)

    with TestClient(served_app) as client:
        made = client.post(
            "/v1/runs", json={"project": "llama", "name": "r"}, headers=bearer(secret)
        )
        assert made.status_code == 201, made.text
        assert made.json()["created_by"] == f"token:{token_id}:trainer"

    listed = run("token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert secret not in listed.stdout
    [row] = json.loads(listed.stdout)
    assert row["id"] == token_id and row["created_by"] == "cli:bob"
    table = run("token", "list")
    assert "trainer" in table.stdout and secret not in table.stdout

    revoked = run("token", "revoke", token_id, LOGNAME="carol")
    assert revoked.returncode == 0, revoked.stderr
    with TestClient(served_app) as client:
        assert_problem(client.get("/v1/runs", headers=bearer(secret)), 401)
    [gone] = json.loads(run("token", "list", "--all", "--json").stdout)
    assert gone["revoked_by"] == "cli:carol"
    unknown = run("token", "revoke", "tok_nothing")
    assert unknown.returncode == 1 and "tok_nothing" in unknown.stderr


def test_token_create_json_and_refusals(ckpt: Ckpt) -> None:
    run = ckpt
    made = run("token", "create", "ops", "--scope", "admin", "--json")
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    remember_secret(body["token"])
    assert body["scopes"] == ["admin"] and body["projects"] == ["*"]
    no_project = run("token", "create", "reader", "--scope", "read")
    assert no_project.returncode == 2 and "projects" in no_project.stderr
    bad_scope = run("token", "create", "reader", "--scope", "write", "--project", "x")
    assert bad_scope.returncode != 0 and "Traceback" not in bad_scope.stderr
    bad_name = run("token", "create", "Bad Name", "--scope", "admin")
    assert bad_name.returncode == 2 and "name" in bad_name.stderr


def test_token_list_at_80_columns_shows_every_id_whole_as_json_does(ckpt: Ckpt) -> None:
    for name, scope, project in (
        ("trainer-llama-70b-east", "register", "llama"),
        ("dashboard-reader", "read", "*"),
        ("ops", "admin", "*"),
    ):
        made = ckpt("token", "create", name, "--scope", scope, "--project", project, "--json")
        assert made.returncode == 0, made.stderr
        remember_secret(json.loads(made.stdout)["token"])

    listed = ckpt("token", "list", "--json")
    table = ckpt("token", "list", COLUMNS="80")
    wide = ckpt("token", "list", COLUMNS="250")

    assert listed.returncode == table.returncode == wide.returncode == 0, table.stderr
    rows = json.loads(listed.stdout)
    assert [r["name"] for r in rows] == ["ops", "dashboard-reader", "trainer-llama-70b-east"]
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert re.findall(r"tok_[0-9a-f]{28}", table.stdout) == [r["id"] for r in rows]
    for r in rows:
        [line] = [line for line in lines if r["id"] in line]
        assert r["name"] in line and ",".join(r["scopes"]) in line
    wide_header = next(line for line in wide.stdout.splitlines() if "scopes" in line)
    for column in ("id", "name", "scopes", "projects", "created", "by", "revoked"):
        assert column in wide_header
    for r in rows:
        [line] = [line for line in wide.stdout.splitlines() if r["id"] in line]
        assert r["created_by"] in line and r["created_at"][:16].replace("T", " ") in line


BOOTSTRAP = remember_secret("serve-bootstrap-secret-0123456789")


@pytest.fixture
def served_with_auth(tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    stderr = tmp_path / "serve.stderr"
    with stderr.open("wb") as sink:
        process = subprocess.Popen(
            [str(CKPT), "serve"],
            cwd=work,
            env=ckpt_env(
                CKPT_DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'ckpt.db'}",
                CKPT_DATA_DIR=str(tmp_path / "data"),
                CKPT_PORT=str(port),
                CKPT_BOOTSTRAP_TOKEN=BOOTSTRAP,
            ),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    server = Served(process, port, stderr)
    try:
        yield server
    finally:
        server.stop()


def test_serve_with_auth_on_from_bootstrap_to_revocation(served_with_auth: Served) -> None:
    assert wait_until_healthy(served_with_auth).status_code == 200
    with httpx.Client(base_url=served_with_auth.base_url, timeout=5.0) as client:
        assert_problem(client.get("/v1/tiers"), 401)
        made = client.post(
            "/v1/tokens",
            json={"name": "reader", "scopes": ["read"], "projects": ["*"]},
            headers=bearer(BOOTSTRAP),
        )
        assert made.status_code == 201, made.text
        secret = remember_secret(made.json()["token"])
        assert client.get("/v1/tiers", headers=bearer(secret)).status_code == 200
        assert_problem(client.post("/v1/sweeps", headers=bearer(secret)), 403)
        revoked = client.delete(f"/v1/tokens/{made.json()['id']}", headers=bearer(BOOTSTRAP))
        assert revoked.status_code == 204
        assert_problem(client.get("/v1/tiers", headers=bearer(secret)), 401)
        assert_problem(client.get("/v1/tiers", headers=bearer(secret + "x")), 401)
    output = served_with_auth.stop()
    entries = [json.loads(line) for line in output.splitlines()]
    starting = next(e for e in entries if e["msg"] == "starting")
    assert starting["auth"] == "on"
    assert any(e["msg"] == "bootstrap token created" for e in entries)
    assert not any("not enforced" in e["msg"] for e in entries)
    assert BOOTSTRAP not in output
    assert secret not in output
