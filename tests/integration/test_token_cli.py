"""`ckpt tokens create|list|revoke` (and the older `ckpt token`) against a real service with
access control on, and `ckpt serve` from its bootstrap token to revocation: the first admin
token is CKPT_BOOTSTRAP_TOKEN, and the command makes every other one with it."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.cells import cell_len
from sqlalchemy import text

from tests.builders import assert_problem, bearer, issue_token, remember_secret
from tests.integration.cli_service import Service
from tests.integration.test_cli import CKPT, Served, ckpt_env, run_ckpt, wait_until_healthy
from tests.storage.ports import free_port


def test_token_create_list_revoke(service: Service) -> None:
    created = service.invoke(
        "token", "create", "trainer", "--scope", "register", "--project", "llama"
    )
    assert created.exit_code == 0, created.output
    secret = remember_secret(created.stdout.strip())
    assert secret.startswith("ckpt_") and "\n" not in secret
    assert "not shown again" in created.stderr and secret not in created.stderr
    token_id = created.stderr.split()[2]
    assert token_id.startswith("tok_")
    with service.engine.connect() as connection:
        stored = connection.execute(text("SELECT * FROM tokens")).all()
    assert secret not in str(stored)
    assert hashlib.sha256(secret.encode()).hexdigest() in str(stored)

    with service.http(secret) as client:
        made = client.post("/v1/runs", json={"project": "llama", "name": "r"})
        assert made.status_code == 201, made.text
        assert made.json()["created_by"] == f"token:{token_id}:trainer"

    listed = service.invoke("tokens", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert secret not in listed.stdout
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"trainer", "ops"}
    assert rows["trainer"]["id"] == token_id
    assert rows["trainer"]["created_by"] == f"token:{service.admin_id}:ops"
    table = service.invoke("token", "list")
    assert "trainer" in table.stdout and secret not in table.stdout

    revoked = service.invoke("tokens", "revoke", token_id)
    assert revoked.exit_code == 0, revoked.output
    assert revoked.stdout == f"token {token_id} revoked\n"
    with service.http(secret) as client:
        assert_problem(client.get("/v1/runs"), 401)
    everything = json.loads(service.invoke("token", "list", "--all", "--json").stdout)
    [gone] = [row for row in everything if row["id"] == token_id]
    assert gone["revoked_by"] == f"token:{service.admin_id}:ops"
    again = service.invoke("tokens", "revoke", token_id, "--json")  # harmless twice
    assert json.loads(again.stdout) == {"id": token_id, "revoked": True}
    unknown = service.invoke("token", "revoke", "tok_nothing")
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("ckpt: Not found: ") and "tok_nothing" in unknown.stderr


def test_token_create_json_and_refusals(service: Service) -> None:
    made = service.invoke("tokens", "create", "deploy", "--scope", "admin", "--json")
    assert made.exit_code == 0, made.output
    body = json.loads(made.stdout)
    remember_secret(body["token"])
    assert body["scopes"] == ["admin"] and body["projects"] == ["*"]
    no_project = service.invoke("tokens", "create", "reader", "--scope", "read")
    assert no_project.exit_code == 1 and "projects" in no_project.stderr
    assert no_project.stderr.startswith("ckpt: Unprocessable entity: ")
    bad_scope = service.invoke("tokens", "create", "reader", "--scope", "write", "--project", "x")
    assert bad_scope.exit_code == 2 and "Traceback" not in bad_scope.output
    bad_name = service.invoke("tokens", "create", "Bad Name", "--scope", "admin")
    assert bad_name.exit_code == 1 and "name" in bad_name.stderr


def test_only_an_admin_token_manages_tokens(service: Service) -> None:
    _id, trainer = issue_token(service.app, name="t", scopes=("register",), projects=("llama",))

    made = service.invoke("tokens", "create", "x", "--scope", "admin", token=trainer)
    listed = service.invoke("tokens", "list", token=trainer)

    for refused in (made, listed):
        assert refused.exit_code == 1
        assert refused.stderr == "ckpt: Forbidden: this token lacks the admin scope\n"
        assert refused.stdout == ""


def test_token_list_at_80_columns_shows_every_id_whole_as_json_does(service: Service) -> None:
    for name, scope, project in (
        ("trainer-llama-70b-east", "register", "llama"),
        ("dashboard-reader", "read", "*"),
        ("deploy", "admin", "*"),
    ):
        made = service.invoke(
            "tokens", "create", name, "--scope", scope, "--project", project, "--json"
        )
        assert made.exit_code == 0, made.output
        remember_secret(json.loads(made.stdout)["token"])

    listed = service.invoke("tokens", "list", "--json")
    table = service.invoke("tokens", "list", columns=80)
    wide = service.invoke("tokens", "list", columns=250)

    assert listed.exit_code == table.exit_code == wide.exit_code == 0, table.output
    rows = json.loads(listed.stdout)
    assert [r["name"] for r in rows] == [
        "deploy",
        "dashboard-reader",
        "trainer-llama-70b-east",
        "ops",
    ]
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert re.findall(r"tok_[0-9a-f]{28}", table.stdout) == [r["id"] for r in rows]
    for r in rows:
        [line] = [line for line in lines if r["id"] in line]
        assert r["name"] in line and ",".join(r["scopes"]) in line
    wide_header = next(line for line in wide.stdout.splitlines() if "scopes" in line)
    for column in ("id", "name", "scopes", "projects", "created", "by", "revoked"):
        assert column in wide_header
    for r in rows:  # the admin's id is in the `by` column too: its own row starts with it
        [line] = [line for line in wide.stdout.splitlines() if line.startswith(f"│ {r['id']}")]
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


def test_serve_with_auth_on_from_bootstrap_to_revocation(
    served_with_auth: Served, tmp_path: Path
) -> None:
    assert wait_until_healthy(served_with_auth).status_code == 200
    elsewhere = tmp_path / "laptop"
    elsewhere.mkdir()
    url = served_with_auth.base_url
    made = run_ckpt(
        "tokens", "create", "reader", "--scope", "read", "--project", "*", "--json",
        cwd=elsewhere, CKPT_URL=url, CKPT_TOKEN=BOOTSTRAP,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    secret = remember_secret(created["token"])
    with httpx.Client(base_url=served_with_auth.base_url, timeout=5.0) as client:
        assert_problem(client.get("/v1/tiers"), 401)
        assert client.get("/v1/tiers", headers=bearer(secret)).status_code == 200
        assert_problem(client.post("/v1/sweeps", headers=bearer(secret)), 403)
    refused = run_ckpt("sweep", cwd=elsewhere, CKPT_URL=url, CKPT_TOKEN=secret)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr == "ckpt: Forbidden: this token lacks the admin scope\n"
    revoked = run_ckpt(
        "tokens", "revoke", created["id"], cwd=elsewhere, CKPT_URL=url, CKPT_TOKEN=BOOTSTRAP
    )
    assert revoked.returncode == 0, revoked.stderr
    with httpx.Client(base_url=served_with_auth.base_url, timeout=5.0) as client:
        assert_problem(client.get("/v1/tiers", headers=bearer(secret)), 401)
        assert_problem(client.get("/v1/tiers", headers=bearer(secret + "x")), 401)
    assert list(elsewhere.iterdir()) == []
    output = served_with_auth.stop()
    entries = [json.loads(line) for line in output.splitlines()]
    starting = next(e for e in entries if e["msg"] == "starting")
    assert starting["auth"] == "on"
    assert any(e["msg"] == "bootstrap token created" for e in entries)
    assert not any("not enforced" in e["msg"] for e in entries)
    assert BOOTSTRAP not in output
    assert secret not in output
