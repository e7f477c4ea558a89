"""The `ckpt` command as a client of a (possibly remote) service: connection options before
or after the command, the exit codes a script tests (3: nothing answered), nothing created
where a command is run, and the groups that drive the ledger, the policies and the audit
trail: against a real service (uvicorn, access control on, SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from app.cli import cli
from tests.integration.cli_service import Service
from tests.integration.test_cli import run_ckpt
from tests.storage.ports import free_port

BAD_URLS = ("ftp://example.com", "http://", "http://host:port", "127.0.0.1:8000")
TIGHT = "name: default\nrules:\n  - {name: keep-1, class: rolling, keep_last: 1, action: delete}\n"


def test_nothing_listening_exits_3_with_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()

    result = run_ckpt("runs", "list", "--url", url, "--timeout", "1", cwd=tmp_path)

    assert result.returncode == 3
    [line] = result.stderr.splitlines()
    assert line.startswith("ckpt: unreachable: ") and url in line and "Connection refused" in line
    assert result.stdout == ""
    assert time.monotonic() - started < 30
    assert list(tmp_path.iterdir()) == []


class WebPage(BaseHTTPRequestHandler):
    """Any web server that is not the catalog: a page for every request."""

    def do_GET(self) -> None:
        page = b"<html><body>Welcome\n to nginx</body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_url_that_is_not_the_catalog_is_said_on_one_line(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WebPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        answered = CliRunner().invoke(cli, ["runs", "list", "--url", url, "--timeout", "2"])
        bad = [CliRunner().invoke(cli, ["runs", "list", "--url", u]) for u in BAD_URLS]
    finally:
        server.shutdown()
        thread.join(timeout=10)

    assert answered.exit_code == 3, answered.output
    [line] = answered.stderr.splitlines()
    assert line == (
        f"ckpt: unreachable: GET /v1/runs: {url} answered, but not with JSON: is --url the "
        "catalog service?"
    )
    for url_given, result in zip(BAD_URLS, bad, strict=True):
        assert result.exit_code == 2, (url_given, result.output)
        assert result.stderr == f"ckpt: --url: an http:// or https:// address, not {url_given!r}\n"


def test_connection_options_before_the_command_and_from_the_environment(
    catalog: Service,
) -> None:
    before = CliRunner().invoke(
        cli, ["--url", catalog.url, "--token", catalog.admin, "runs", "list", "--json"]
    )
    from_env = CliRunner().invoke(
        cli, ["runs", "list", "--json"], env={"CKPT_URL": catalog.url, "CKPT_TOKEN": catalog.admin}
    )

    assert before.exit_code == 0, before.output
    assert [r["id"] for r in json.loads(before.stdout)] == [catalog.run["id"]]
    assert from_env.exit_code == 0, from_env.output
    assert json.loads(from_env.stdout) == json.loads(before.stdout)


def test_commands_create_nothing_where_they_run(catalog: Service) -> None:
    """Run from an empty directory, a command that does not serve leaves it empty (it once
    created ./var/ckpt.db and failed with "no policy is named 'default'")."""
    commands = [
        ("plan",),
        ("report",),
        ("runs", "list"),
        ("checkpoints", "list", catalog.run["id"]),
        ("policies", "list"),
        ("forecast", "--run-days", "10", "--checkpoint-bytes", "1e12", "--no-chart"),
        ("audit",),
    ]
    for args in commands:
        result = catalog.ckpt(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert list(catalog.cwd.iterdir()) == [], args
    offline = run_ckpt("plan", "--timeout", "0.5", cwd=catalog.cwd)  # the default url
    assert offline.returncode == 3, offline.stderr
    assert list(catalog.cwd.iterdir()) == []
    local = run_ckpt("policy", "validate", str(catalog.policies_dir / "default.yaml"),
                     cwd=catalog.cwd)  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert list(catalog.cwd.iterdir()) == []


# --- policies, held actions and their approval, the audit trail -----------------------------


class Held(NamedTuple):
    sweep_id: str
    action_ids: list[str]


@pytest.fixture
def held(catalog: Service, tmp_path: Path) -> Held:
    """The default policy replaced by one keeping a single rolling checkpoint: a sweep
    plans four deletes of five, beyond the blast radius, so they are held."""
    policy = tmp_path / "tight.yaml"
    policy.write_text(TIGHT)
    put = catalog.invoke("policies", "put", str(policy))
    assert put.exit_code == 0, put.output
    assert put.stdout == "policy default stored (1 rules)\n"
    swept = catalog.invoke("sweep", "--json")
    assert swept.exit_code == 0, swept.output
    document = json.loads(swept.stdout)
    return Held(document["sweep_id"], document["action_ids"])


def test_policies_put_show_list_and_delete(catalog: Service, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nrules:\n  - {name: all, action: {copy_to: archive}}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nrules:\n  - {name: r, action: {move_to: tape}}\n")

    stored = catalog.invoke("policies", "put", str(other), "--json")
    refused = catalog.invoke("policies", "put", str(bad))
    listed = catalog.invoke("policies", "list", "--json")
    shown = catalog.invoke("policy", "show", "other")
    deleted = catalog.invoke("policies", "delete", "other", "--json")
    gone = catalog.invoke("policies", "show", "other")

    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.stdout)["source"] == "api"
    assert refused.exit_code == 1
    assert refused.stderr.startswith("ckpt: Unprocessable entity: ") and "tape" in refused.stderr
    assert [p["name"] for p in json.loads(listed.stdout)] == ["default", "other"]
    assert "copy_to: archive" in shown.stdout and shown.stdout.startswith("# source: api")
    assert json.loads(deleted.stdout) == {"name": "other", "deleted": True}
    assert gone.exit_code == 1 and gone.stderr.startswith("ckpt: Not found: ")


def test_a_sweep_says_what_it_held(catalog: Service, tmp_path: Path) -> None:
    policy = tmp_path / "tight.yaml"
    policy.write_text(TIGHT)
    assert catalog.invoke("policies", "put", str(policy)).exit_code == 0

    result = catalog.invoke("sweep", columns=80)

    assert result.exit_code == 0, result.output
    [written, held] = result.stdout.splitlines()
    sweep_id = re.fullmatch(r"sweep (swp_\w+): 4 actions written to the ledger", written)
    assert sweep_id is not None
    assert held.startswith("4 held beyond the blast radius")
    assert held.endswith(f"`ckpt actions approve-sweep {sweep_id[1]}`")


def test_held_actions_listed_and_approved_one_by_one(catalog: Service, held: Held) -> None:
    listed = catalog.invoke("actions", "list", "--state", "held", "--json")
    table = catalog.invoke("actions", "list", "--state", "held", columns=80)

    actions = json.loads(listed.stdout)
    assert sorted(a["step"] for a in actions) == [1, 2, 3, 4]
    assert {a["id"] for a in actions} == set(held.action_ids)
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert sorted(re.findall(r"act_[0-9a-f]{28}", table.stdout)) == sorted(a["id"] for a in actions)
    first = actions[0]["id"]
    approved = catalog.invoke("actions", "approve", first, "--json")
    assert approved.exit_code == 0, approved.output
    [released] = json.loads(approved.stdout)
    assert released["state"] == "pending"
    assert released["approved_by"] == f"token:{catalog.admin_id}:ops"
    shown = catalog.invoke("actions", "show", first)
    assert f"approved by token:{catalog.admin_id}:ops" in shown.stdout
    unknown = catalog.invoke("actions", "approve", "act_nothing")
    assert unknown.exit_code == 1 and unknown.stderr.startswith("ckpt: Not found: ")


def test_a_sweep_s_held_actions_approved_at_once(catalog: Service, held: Held) -> None:
    result = catalog.invoke("actions", "approve-sweep", held.sweep_id)

    assert result.exit_code == 0, result.output
    assert result.stdout == f"sweep {held.sweep_id}: 4 actions approved\n"
    assert {(a[1], a[2]) for a in catalog.actions()} == {("delete", "pending")}


def test_audit_trail_filtered_and_readable(catalog: Service, held: Held) -> None:
    pinned = catalog.invoke("checkpoints", "pin", catalog.ckpts[5]["id"], "--reason", "keep")
    assert pinned.exit_code == 0, pinned.output

    everything = catalog.invoke("audit", "--json")
    mine = catalog.invoke("audit", "--actor", f"token:{catalog.admin_id}:*", "--json")
    of_one = catalog.invoke("audit", "--checkpoint", catalog.ckpts[5]["id"], columns=80)

    events = json.loads(everything.stdout)
    assert {"registered", "pinned"} <= {e["event"] for e in events}
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)  # oldest first
    assert {e["actor"] for e in json.loads(mine.stdout)} == {f"token:{catalog.admin_id}:ops"}
    lines = of_one.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert "pinned" in of_one.stdout and "registered" in of_one.stdout


def test_a_client_command_loads_neither_the_database_nor_the_web_framework() -> None:
    """An admin's laptop runs `ckpt runs list` often: it imports what asking needs (the
    client library, typer, rich), none of what serving needs."""
    probe = (
        "import sys; from app.cli import cli; "
        "print(sorted(m for m in ('sqlalchemy', 'fastapi', 'uvicorn', 'alembic', "
        "'apscheduler', 'prometheus_client', 'boto3', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == "[]\n", result.stderr
