"""`ckpt plan`, `ckpt sweep`, `ckpt worker --once` and `ckpt policy ...` as an operator runs
them: real processes configured by environment variables, on a SQLite catalog and local
tiers under a temporary directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db.migrate import upgrade
from app.db.models import Action, Sweep
from app.db.session import make_engine
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import make_run, place_checkpoint, step_dir, step_files, tree

CKPT = Path(sys.executable).parent / "ckpt"
SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


@dataclass
class Setup:
    root: Path
    url: str
    data_dir: Path
    policies_dir: Path
    run: dict[str, Any]
    ckpts: dict[int, dict[str, Any]]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")}
        env.update(
            CKPT_DATABASE_URL=self.url,
            CKPT_DATA_DIR=str(self.data_dir),
            CKPT_POLICIES_DIR=str(self.policies_dir),
            CKPT_AUTH="off",
            COLUMNS="250",  # wide tables: no cell is cut short
        )
        env.update(extra)
        return env

    def ckpt(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CKPT), *args],
            cwd=self.root,
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def actions(self) -> list[tuple[str, str, str, str]]:
        """(checkpoint id, kind, state, rule) of every ledger row."""
        engine = make_engine(self.url, pool_size=1)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(Action.checkpoint_id, Action.kind, Action.state, Action.rule)
                ).all()
        finally:
            engine.dispose()
        return sorted((r[0], r[1], r[2], r[3]) for r in rows)


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return make_setup(tmp_path)


def make_setup(tmp_path: Path) -> Setup:
    """The shipped default policy; one active run with five rolling checkpoints on hot."""
    url = f"sqlite:///{tmp_path / 'db' / 'ckpt.db'}"
    data_dir = tmp_path / "data"
    policies_dir = tmp_path / "policies"
    policies_dir.mkdir()
    shutil.copy(SHIPPED_POLICY, policies_dir / "default.yaml")
    upgrade(url)
    settings = Settings(database_url=url, data_dir=data_dir, policies_dir=policies_dir, auth="off")
    with TestClient(create_app(settings, roles=NO_BACKGROUND)) as client:
        run = make_run(client, "llm", "run-1")
        ckpts = {step: place_checkpoint(client, data_dir, run, step) for step in range(1, 6)}
    return Setup(tmp_path, url, data_dir, policies_dir, run, ckpts)


def test_plan_json_shows_actions_kept_and_totals(setup: Setup) -> None:
    result = setup.ckpt("plan", "--json")

    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    actions = plan["actions"]
    assert sorted(a["step"] for a in actions) == [1, 2]
    for action in actions:
        assert action["checkpoint_id"] == setup.ckpts[action["step"]]["id"]
        assert action["kind"] == "delete"
        assert action["rule"] == "default/rolling-keep-3"
        assert "keep_last 3" in action["reason"]
        assert action["state"] == "pending"
        assert action["from_tier"] == "hot"
    kept = {k["step"]: k for k in plan["kept"]}
    assert sorted(kept) == [3, 4, 5]
    assert "rolling-keep-3: keep_last 3" in kept[3]["reasons"]
    assert kept[5]["reasons"][0].startswith("protected: resume point")
    size = setup.ckpts[1]["size_bytes"]
    assert plan["totals"]["deleted_bytes_by_tier"] == {"hot": 2 * size}
    assert plan["skipped"] == []
    assert setup.actions() == []


def test_plan_of_one_run_and_a_what_if_policy_file(setup: Setup) -> None:
    what_if = setup.root / "what-if.yaml"
    what_if.write_text(
        "name: what-if\nrules:\n"
        "  - name: keep-1\n    class: rolling\n    keep_last: 1\n    action: delete\n"
    )

    result = setup.ckpt("plan", "--json", "--run", setup.run["id"], "--policy", str(what_if))

    assert result.returncode == 0, result.stderr
    actions = json.loads(result.stdout)["actions"]
    assert sorted(a["step"] for a in actions) == [1, 2, 3, 4]
    assert {a["rule"] for a in actions} == {"what-if/keep-1"}
    assert setup.actions() == []


def test_plan_of_an_unknown_run_exits_2_naming_run_id(setup: Setup) -> None:
    result = setup.ckpt("plan", "--run", "run_nothing")

    assert result.returncode == 2
    assert "run_id" in result.stderr and "run_nothing" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_table_lists_actions_and_kept(setup: Setup) -> None:
    result = setup.ckpt("plan", "--kept")

    assert result.returncode == 0, result.stderr
    assert "2 planned actions" in result.stdout
    assert "3 checkpoints kept" in result.stdout
    for step in (1, 2):
        assert setup.ckpts[step]["id"] in result.stdout
    assert "default/rolling-keep-3" in result.stdout
    assert "deleted from hot" in result.stdout


def test_sweep_dry_run_prints_the_plan_and_writes_nothing(setup: Setup) -> None:
    result = setup.ckpt("sweep", "--dry-run")

    assert result.returncode == 0, result.stderr
    assert "2 planned actions" in result.stdout
    assert setup.ckpts[1]["id"] in result.stdout
    assert "default/rolling-keep-3" in result.stdout
    assert setup.actions() == []


def test_sweep_writes_the_ledger_once(setup: Setup) -> None:
    result = setup.ckpt("sweep")

    assert result.returncode == 0, result.stderr
    assert re.search(r"^sweep swp_\w+: 2 actions written to the ledger$", result.stdout, re.M)
    assert setup.actions() == sorted(
        (setup.ckpts[s]["id"], "delete", "pending", "default/rolling-keep-3") for s in (1, 2)
    )
    again = setup.ckpt("sweep")
    assert again.returncode == 0, again.stderr
    assert "0 actions written to the ledger" in again.stdout
    assert len(setup.actions()) == 2


def test_an_operator_s_sweep_records_the_operator(setup: Setup) -> None:
    result = setup.ckpt("sweep", LOGNAME="alice", USER="alice")
    assert result.returncode == 0, result.stderr
    engine = make_engine(setup.url, pool_size=1)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(Sweep.actor)).scalars().all() == ["cli:alice"]
            actors = conn.execute(select(Action.actor)).scalars().all()
    finally:
        engine.dispose()
    assert actors == ["rule:default/rolling-keep-3"] * 2


def test_worker_once_executes_what_is_due_and_exits(setup: Setup) -> None:
    assert setup.ckpt("sweep").returncode == 0

    result = setup.ckpt("worker", "--once")

    assert result.returncode == 0, result.stderr
    assert "2 actions executed" in result.stdout
    assert {(a[1], a[2]) for a in setup.actions()} == {("delete", "done")}
    for step in (1, 2):  # trashed: the bytes stay for the trash period
        assert tree(step_dir(setup.data_dir, "hot", setup.run, step)) == step_files(step)
    idle = setup.ckpt("worker", "--once")
    assert idle.returncode == 0, idle.stderr
    assert "0 actions executed" in idle.stdout


def test_worker_once_purges_at_once_with_zero_retention(setup: Setup) -> None:
    assert setup.ckpt("sweep").returncode == 0

    result = setup.ckpt("worker", "--once", CKPT_TRASH_RETENTION="0s")

    assert result.returncode == 0, result.stderr
    assert "4 actions executed" in result.stdout
    assert (
        sorted((a[1], a[2]) for a in setup.actions())
        == [("delete", "done")] * 2 + [("purge", "done")] * 2
    )
    on_hot = sorted(p.name for p in step_dir(setup.data_dir, "hot", setup.run, 1).parent.iterdir())
    assert on_hot == ["step-3", "step-4", "step-5"]


def test_commands_refuse_a_bad_policy_file(setup: Setup) -> None:
    bad = setup.policies_dir / "broken.yaml"
    bad.write_text("name: broken\nrules:\n  - name: r1\n    keep_last: -4\n    action: delete\n")

    for args in (("plan",), ("sweep",), ("worker", "--once")):
        result = setup.ckpt(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert str(bad) in result.stderr
        assert "r1" in result.stderr and "keep_last" in result.stderr
        assert "Traceback" not in result.stderr
    assert setup.actions() == []


# --- ckpt policy ------------------------------------------------------------------------------


def test_policy_schema_prints_the_json_schema(setup: Setup) -> None:
    result = setup.ckpt("policy", "schema")

    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert {"name", "rules", "applies_to", "priority"} <= set(schema["properties"])
    assert "name" in schema["required"]
    rule = json.dumps(schema)
    for field in ("keep_last", "keep_best", "move_to", "copy_to", "run_ended"):
        assert field in rule


def test_policy_validate_accepts_the_shipped_policy(setup: Setup) -> None:
    result = setup.ckpt("policy", "validate", str(SHIPPED_POLICY))

    assert result.returncode == 0, result.stderr
    assert f"{SHIPPED_POLICY}: ok (default, 4 rules)" in result.stdout


def test_policy_validate_names_file_rule_and_field(setup: Setup) -> None:
    good = setup.root / "good.yaml"
    good.write_text("name: good\nrules:\n  - name: all\n    action: {copy_to: archive}\n")
    bad = setup.root / "bad.yaml"
    bad.write_text(
        "name: bad\nrules:\n  - name: cool-down\n    when: {age: 3 weeks}\n"
        "    action: {move_to: tape}\n"
    )

    result = setup.ckpt("policy", "validate", str(good), str(bad))

    assert result.returncode == 1
    assert f"{good}: ok (good, 1 rules)" in result.stdout
    assert str(bad) in result.stderr
    assert "cool-down" in result.stderr
    assert "when.age" in result.stderr and "tape" in result.stderr
    assert str(good) not in result.stderr
    assert "Traceback" not in result.stderr


def test_policy_validate_knows_the_configured_tiers(setup: Setup, tmp_path: Path) -> None:
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(
        f"tiers:\n  - name: fast\n    url: file://{tmp_path}/fast\n"
        f"  - name: tape\n    url: file://{tmp_path}/tape\n"
    )
    policy = tmp_path / "to-tape.yaml"
    policy.write_text("name: to-tape\nrules:\n  - name: r\n    action: {move_to: tape}\n")

    with_tape = setup.ckpt("policy", "validate", str(policy), CKPT_TIERS_FILE=str(tiers))
    default_tiers = setup.ckpt("policy", "validate", str(policy))

    assert with_tape.returncode == 0, with_tape.stderr
    assert default_tiers.returncode == 1
    assert "unknown tier 'tape'" in default_tiers.stderr
