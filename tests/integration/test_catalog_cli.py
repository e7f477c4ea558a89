"""`ckpt runs ...` and `ckpt checkpoints ...` against a real service (uvicorn, access control
on, SQLite and PostgreSQL): tables that keep ids whole at 80 columns, `--json` that is the
service's own answer, refusals said as the problem's title and detail with exit 1, and
`restore --wait`, which ends when a real worker has staged the copy."""

from __future__ import annotations

import json
import re
import subprocess
import time

from rich.cells import cell_len

from tests.builders import issue_token, make_executor, step_files, tree
from tests.integration.cli_service import CKPT, Service

CHECKPOINT_ID = re.compile(r"ckpt_[0-9a-f]{28}")
RUN_ID = re.compile(r"run_[0-9a-f]{28}")


def test_runs_list_show_and_end(catalog: Service) -> None:
    with catalog.http() as client:
        other = client.post(
            "/v1/runs",
            json={"project": "vision", "name": "run-2", "labels": {"team": "cv", "gpu": "h100"}},
        ).json()

    everything = catalog.invoke("runs", "list", "--json")
    llm = catalog.invoke("runs", "list", "--project", "llm", "--json")
    labelled = catalog.invoke("runs", "list", "--label", "team:cv", "--label", "gpu:h100", "--json")
    mislabelled = catalog.invoke("runs", "list", "--label", "team:cv", "--label", "gpu:a100")
    malformed = catalog.invoke("runs", "list", "--label", "team")
    table = catalog.invoke("runs", "list", columns=80)
    shown = catalog.invoke("runs", "show", other["id"], "--json")
    ended = catalog.invoke("runs", "end", other["id"], "--failed", "--json")
    completed = catalog.invoke("runs", "end", catalog.run["id"])
    active = catalog.invoke("runs", "list", "--status", "active", "--json")

    assert everything.exit_code == 0, everything.output
    assert {r["id"] for r in json.loads(everything.stdout)} == {catalog.run["id"], other["id"]}
    assert [r["name"] for r in json.loads(llm.stdout)] == ["run-1"]
    assert [r["id"] for r in json.loads(labelled.stdout)] == [other["id"]]
    assert "0 runs" in mislabelled.stdout
    assert malformed.exit_code == 2 and "KEY:VALUE" in malformed.stderr
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert sorted(RUN_ID.findall(table.stdout)) == sorted([catalog.run["id"], other["id"]])
    assert json.loads(shown.stdout) == other
    assert ended.exit_code == 0, ended.output
    assert json.loads(ended.stdout)["status"] == "failed"
    assert json.loads(ended.stdout)["ended_at"] is not None
    assert completed.stdout == f"run {catalog.run['id']} (llm/run-1) completed\n"
    assert json.loads(active.stdout) == []


def test_checkpoints_list_and_show(catalog: Service) -> None:
    listed = catalog.invoke("checkpoints", "list", catalog.run["id"], "--json")
    table = catalog.invoke("checkpoints", "list", catalog.run["id"], columns=80)
    shown = catalog.invoke("checkpoints", "show", catalog.ckpts[3]["id"], columns=80)
    as_json = catalog.invoke("checkpoints", "show", catalog.ckpts[3]["id"], "--json")

    assert listed.exit_code == table.exit_code == shown.exit_code == 0, table.output
    assert [c["step"] for c in json.loads(listed.stdout)] == [5, 4, 3, 2, 1]
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert CHECKPOINT_ID.findall(table.stdout) == [catalog.ckpts[s]["id"] for s in (5, 4, 3, 2, 1)]
    assert catalog.ckpts[3]["id"] in shown.stdout
    assert f"primary on hot: {catalog.ckpts[3]['uri']}\n" in shown.stdout
    table_lines = [line for line in shown.stdout.splitlines() if "file://" not in line]
    assert max(cell_len(line) for line in table_lines) <= 80
    document = json.loads(as_json.stdout)
    assert document["id"] == catalog.ckpts[3]["id"] and document["tier"] == "hot"
    assert [loc["uri"] for loc in document["locations"]] == [catalog.ckpts[3]["uri"]]


def test_pin_delete_undelete_and_their_refusals(catalog: Service) -> None:
    target = catalog.ckpts[2]["id"]

    pinned = catalog.invoke("checkpoints", "pin", target, "--reason", "eval baseline", "--json")
    refused = catalog.invoke("checkpoints", "delete", target)
    unpinned = catalog.invoke("checkpoints", "unpin", target)
    deleted = catalog.invoke("checkpoints", "delete", target, "--json")

    assert pinned.exit_code == 0, pinned.output
    assert json.loads(pinned.stdout)["pin_reason"] == "eval baseline"
    assert refused.exit_code == 1
    [line] = refused.stderr.splitlines()
    assert line.startswith("ckpt: Conflict: ") and "pin" in line
    assert unpinned.stdout == f"checkpoint {target} (step 2) unpinned\n"
    action = json.loads(deleted.stdout)
    assert action["kind"] == "delete" and action["checkpoint_id"] == target
    assert make_executor(catalog.app).drain() == 1
    undeleted = catalog.invoke("checkpoints", "undelete", target, "--json")
    assert undeleted.exit_code == 0, undeleted.output
    assert json.loads(undeleted.stdout)["state"] == "active"
    assert json.loads(undeleted.stdout)["protected_until"] is not None

    unknown = catalog.invoke("checkpoints", "show", "ckpt_nothing")
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("ckpt: Not found: ") and "ckpt_nothing" in unknown.stderr
    moon = catalog.invoke("checkpoints", "restore", target, "--tier", "moon")
    assert moon.exit_code == 1
    assert moon.stderr == "ckpt: Unprocessable entity: tier: unknown tier 'moon'\n"


def test_a_read_token_lists_but_may_not_pin(catalog: Service) -> None:
    _id, reader = issue_token(catalog.app, name="reader", scopes=("read",), projects=("llm",))

    listed = catalog.invoke("checkpoints", "list", catalog.run["id"], "--json", token=reader)
    refused = catalog.invoke(
        "checkpoints", "pin", catalog.ckpts[1]["id"], "--reason", "x", token=reader
    )

    assert listed.exit_code == 0 and len(json.loads(listed.stdout)) == 5
    assert refused.exit_code == 1
    assert refused.stderr == "ckpt: Forbidden: this token lacks the admin scope\n"


def test_restore_wait_ends_when_a_worker_has_staged_the_copy(catalog: Service) -> None:
    target = catalog.ckpts[4]
    command = subprocess.Popen(
        [str(CKPT), *catalog.args(("checkpoints", "restore", target["id"], "--tier", "warm",
                                   "--wait", "--json"), None)],
        cwd=catalog.cwd, env=catalog.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        worker = make_executor(catalog.app)
        deadline = time.monotonic() + 60
        executed = 0
        while executed == 0:  # the command asks first; the worker runs what it asked for
            assert command.poll() is None, command.communicate()
            assert time.monotonic() < deadline, "the restore was never asked for"
            executed += worker.drain()
            time.sleep(0.05)
        out, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()

    assert command.returncode == 0, err
    action = json.loads(out)
    assert action["kind"] == "restore" and action["state"] == "done"
    assert action["to_tier"] == "warm" and action["bytes_done"] == action["bytes"]
    staged = catalog.data_dir / "warm" / "llm" / "run-1" / "step-4"
    assert tree(staged) == step_files(4)
    with catalog.http() as client:
        tiers = {loc["tier"] for loc in client.get(f"/v1/checkpoints/{target['id']}").json()[
            "locations"]}  # fmt: skip
    assert tiers == {"hot", "warm"}


def test_restore_wait_gives_up_when_told(catalog: Service) -> None:
    """No worker runs: the wait ends after --max-wait, exit 1, saying where it stands."""
    result = catalog.invoke(
        "checkpoints", "restore", catalog.ckpts[5]["id"], "--tier", "cold", "--wait",
        "--max-wait", "0.5",
    )  # fmt: skip

    assert result.exit_code == 1
    assert re.fullmatch(r"ckpt: restore act_\w+ did not finish: it is pending\n", result.stderr)
    assert "pending" in result.stdout
