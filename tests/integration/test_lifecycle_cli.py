"""`ckpt plan`, `ckpt sweep` and `ckpt policy ...` as an operator runs them, against a real
service (uvicorn, access control on, SQLite and PostgreSQL), and `ckpt worker --once`,
which is the service and opens the database itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import cli
from app.db.models import Action, Sweep
from tests.builders import issue_token, step_dir, step_files, tree
from tests.integration.cli_service import SHIPPED_POLICY, Service


def test_plan_json_shows_actions_kept_and_totals(catalog: Service) -> None:
    result = catalog.invoke("plan", "--json")

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    actions = plan["actions"]
    assert sorted(a["step"] for a in actions) == [1, 2]
    for action in actions:
        assert action["checkpoint_id"] == catalog.ckpts[action["step"]]["id"]
        assert action["kind"] == "delete"
        assert action["rule"] == "default/rolling-keep-3"
        assert "keep_last 3" in action["reason"]
        assert action["state"] == "pending"
        assert action["from_tier"] == "hot"
    kept = {k["step"]: k for k in plan["kept"]}
    assert sorted(kept) == [3, 4, 5]
    assert "rolling-keep-3: keep_last 3" in kept[3]["reasons"]
    assert kept[5]["reasons"][0].startswith("protected: resume point")
    size = catalog.ckpts[1]["size_bytes"]
    assert plan["totals"]["deleted_bytes_by_tier"] == {"hot": 2 * size}
    assert plan["skipped"] == []
    assert catalog.actions() == []


def test_plan_of_one_run_and_a_what_if_policy_file(catalog: Service, tmp_path: Path) -> None:
    what_if = tmp_path / "what-if.yaml"
    what_if.write_text(
        "name: what-if\nrules:\n"
        "  - name: keep-1\n    class: rolling\n    keep_last: 1\n    action: delete\n"
    )

    result = catalog.invoke("plan", "--json", "--run", catalog.run["id"], "--policy", str(what_if))

    assert result.exit_code == 0, result.output
    actions = json.loads(result.stdout)["actions"]
    assert sorted(a["step"] for a in actions) == [1, 2, 3, 4]
    assert {a["rule"] for a in actions} == {"what-if/keep-1"}
    assert catalog.actions() == []


def test_plan_with_a_stored_policy_by_name_or_a_missing_file(catalog: Service) -> None:
    by_name = catalog.invoke("plan", "--json", "--policy", "default")
    unknown = catalog.invoke("plan", "--policy", "nothing")
    typo = catalog.invoke("plan", "--policy", "what-iff.yaml")

    assert by_name.exit_code == 0, by_name.output
    assert len(json.loads(by_name.stdout)["actions"]) == 2
    assert unknown.exit_code == 1 and unknown.stderr.startswith("ckpt: Not found: ")
    assert typo.exit_code == 2
    assert typo.stderr == "ckpt: --policy: no such file 'what-iff.yaml'\n"


def test_plan_of_an_unknown_run_exits_1_with_the_problem(catalog: Service) -> None:
    result = catalog.invoke("plan", "--run", "run_nothing")

    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("ckpt: Not found: ")
    assert "run_id" in line and "run_nothing" in line
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_plan_table_lists_actions_and_kept(catalog: Service) -> None:
    result = catalog.invoke("plan", "--kept")

    assert result.exit_code == 0, result.output
    assert "2 planned actions" in result.stdout
    assert "3 checkpoints kept" in result.stdout
    for step in (1, 2):
        assert catalog.ckpts[step]["id"] in result.stdout
    assert "default/rolling-keep-3" in result.stdout
    assert "deleted from hot" in result.stdout


def test_sweep_dry_run_prints_the_plan_and_writes_nothing(catalog: Service) -> None:
    result = catalog.invoke("sweep", "--dry-run")

    assert result.exit_code == 0, result.output
    assert "2 planned actions" in result.stdout
    assert catalog.ckpts[1]["id"] in result.stdout
    assert "default/rolling-keep-3" in result.stdout
    assert catalog.actions() == []


def test_sweep_writes_the_ledger_once(catalog: Service) -> None:
    result = catalog.invoke("sweep")

    assert result.exit_code == 0, result.output
    assert re.search(r"^sweep swp_\w+: 2 actions written to the ledger$", result.stdout, re.M)
    assert catalog.actions() == sorted(
        (catalog.ckpts[s]["id"], "delete", "pending", "default/rolling-keep-3") for s in (1, 2)
    )
    again = catalog.invoke("sweep")
    assert again.exit_code == 0, again.output
    assert "0 actions written to the ledger" in again.stdout
    assert len(catalog.actions()) == 2


def test_a_sweep_records_the_token_that_asked(catalog: Service) -> None:
    result = catalog.invoke("sweep")

    assert result.exit_code == 0, result.output
    with catalog.engine.connect() as conn:
        assert conn.execute(select(Sweep.actor)).scalars().all() == [
            f"token:{catalog.admin_id}:ops"
        ]
        actors = conn.execute(select(Action.actor)).scalars().all()
    assert actors == ["rule:default/rolling-keep-3"] * 2


def test_a_read_token_plans_but_may_not_sweep(catalog: Service) -> None:
    _id, reader = issue_token(catalog.app, name="reader", scopes=("read",), projects=("*",))

    planned = catalog.invoke("plan", "--json", token=reader)
    refused = catalog.invoke("sweep", token=reader)
    nobody = catalog.invoke("plan", token="")

    assert planned.exit_code == 0, planned.output
    assert len(json.loads(planned.stdout)["actions"]) == 2
    assert refused.exit_code == 1
    assert refused.stderr == "ckpt: Forbidden: this token lacks the admin scope\n"
    assert nobody.exit_code == 1
    assert nobody.stderr.startswith("ckpt: Unauthorized: ")
    assert "--token or CKPT_TOKEN" in nobody.stderr
    assert catalog.actions() == []


def test_worker_once_executes_what_is_due_and_exits(catalog: Service) -> None:
    assert catalog.invoke("sweep").exit_code == 0

    result = catalog.serving("worker", "--once")

    assert result.returncode == 0, result.stderr
    assert "2 actions executed" in result.stdout
    assert {(a[1], a[2]) for a in catalog.actions()} == {("delete", "done")}
    for step in (1, 2):  # trashed: the bytes stay for the trash period
        assert tree(step_dir(catalog.data_dir, "hot", catalog.run, step)) == step_files(step)
    idle = catalog.serving("worker", "--once")
    assert idle.returncode == 0, idle.stderr
    assert "0 actions executed" in idle.stdout


def test_worker_once_purges_at_once_with_zero_retention(catalog: Service) -> None:
    assert catalog.invoke("sweep").exit_code == 0

    result = catalog.serving("worker", "--once", CKPT_TRASH_RETENTION="0s")

    assert result.returncode == 0, result.stderr
    assert "4 actions executed" in result.stdout
    assert (
        sorted((a[1], a[2]) for a in catalog.actions())
        == [("delete", "done")] * 2 + [("purge", "done")] * 2
    )
    on_hot = step_dir(catalog.data_dir, "hot", catalog.run, 1).parent.iterdir()
    assert sorted(p.name for p in on_hot) == ["step-3", "step-4", "step-5"]


def test_the_worker_refuses_a_bad_policy_file(catalog: Service) -> None:
    bad = catalog.policies_dir / "broken.yaml"
    bad.write_text("name: broken\nrules:\n  - name: r1\n    keep_last: -4\n    action: delete\n")
    assert catalog.invoke("sweep").exit_code == 0  # the service read its files at start

    result = catalog.serving("worker", "--once")

    assert result.returncode == 2, (result.stdout, result.stderr)
    assert str(bad) in result.stderr
    assert "r1" in result.stderr and "keep_last" in result.stderr
    assert "Traceback" not in result.stderr
    assert {a[2] for a in catalog.actions()} == {"pending"}


# --- ckpt policies (and its older name, ckpt policy) ------------------------------------------


def local(*args: str, **env: str) -> tuple[int, str, str]:
    """A command that needs no service, in this process."""
    result = CliRunner().invoke(cli, list(args), env={"CKPT_TIERS_FILE": None, **env})
    return result.exit_code, result.stdout, result.stderr


def test_policy_schema_prints_the_json_schema() -> None:
    for group in ("policy", "policies"):
        code, out, err = local(group, "schema")

        assert code == 0, err
        schema = json.loads(out)
        assert {"name", "rules", "applies_to", "priority"} <= set(schema["properties"])
        assert "name" in schema["required"]
        rule = json.dumps(schema)
        for field in ("keep_last", "keep_best", "move_to", "copy_to", "run_ended"):
            assert field in rule


def test_policy_validate_accepts_the_shipped_policy() -> None:
    for group in ("policy", "policies"):
        code, out, err = local(group, "validate", str(SHIPPED_POLICY))

        assert code == 0, err
        assert f"{SHIPPED_POLICY}: ok (default, 4 rules)" in out


def test_policy_validate_names_file_rule_and_field(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: good\nrules:\n  - name: all\n    action: {copy_to: archive}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nrules:\n  - name: cool-down\n    when: {age: 3 weeks}\n"
        "    action: {move_to: tape}\n"
    )

    code, out, err = local("policies", "validate", str(good), str(bad))

    assert code == 1
    assert f"{good}: ok (good, 1 rules)" in out
    assert str(bad) in err
    assert "cool-down" in err
    assert "when.age" in err and "tape" in err
    assert str(good) not in err
    assert "Traceback" not in err
    code, out, err = local("policies", "validate", str(good), str(bad), "--json")
    assert code == 1 and err == ""
    verdicts = json.loads(out)
    assert verdicts[0] == {"file": str(good), "ok": True, "name": "good", "rules": 1}
    assert verdicts[1]["ok"] is False and "tape" in verdicts[1]["error"]
    assert verdicts[1]["field"].startswith("rules[0]")
    missing = local("policies", "validate", str(tmp_path / "nowhere.yaml"))
    assert missing[0] == 1 and "nowhere.yaml" in missing[2] and "Traceback" not in missing[2]


def test_policy_validate_knows_the_configured_tiers(tmp_path: Path) -> None:
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(
        f"tiers:\n  - name: fast\n    url: file://{tmp_path}/fast\n"
        f"  - name: tape\n    url: file://{tmp_path}/tape\n"
    )
    policy = tmp_path / "to-tape.yaml"
    policy.write_text("name: to-tape\nrules:\n  - name: r\n    action: {move_to: tape}\n")

    with_tape = local("policy", "validate", str(policy), CKPT_TIERS_FILE=str(tiers))
    default_tiers = local("policy", "validate", str(policy))

    assert with_tape[0] == 0, with_tape[2]
    assert default_tiers[0] == 1
    assert "unknown tier 'tape'" in default_tiers[2]
    assert not (tmp_path / "fast").exists()  # validating creates no tier directory
