"""`ckpt reconcile` and `ckpt reconcile delete-orphans` as an operator runs them: real
processes on a SQLite catalog and local tiers, with objects left behind and files lost."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.integration.test_lifecycle_cli import Setup, make_setup

HOUR = 3600.0
OLD_KEY = "llm/run-1/step-9-crashed-upload/model-00001-of-00008.safetensors"
YOUNG_KEY = "llm/run-1/step-6/being-written.bin"


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return make_setup(tmp_path)


def stray(setup: Setup, key: str, age_s: float = 0) -> Path:
    """An object on the hot tier that no checkpoint owns, last written `age_s` ago."""
    path = setup.data_dir / "hot" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left behind")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def lose_a_file(setup: Setup, step: int) -> str:
    """Remove one catalogued file of `step`; its checkpoint drifts."""
    root = setup.data_dir / "hot" / "llm" / "run-1" / f"step-{step}"
    victim = sorted(p for p in root.rglob("*") if p.is_file())[0]
    victim.unlink()
    return str(setup.ckpts[step]["id"])


def test_reconcile_at_80_columns_shows_whole_keys_and_ids_as_json_does(setup: Setup) -> None:
    stray(setup, OLD_KEY, age_s=2 * HOUR)
    drifting = lose_a_file(setup, 4)

    document = setup.ckpt("reconcile", "--json")
    table = setup.ckpt("reconcile", COLUMNS="80")

    assert document.returncode == 0 and table.returncode == 0, (document.stderr, table.stderr)
    body = json.loads(document.stdout)
    assert [(o["tier"], o["key"]) for o in body["orphans"]] == [("hot", OLD_KEY)]
    assert [(d["checkpoint_id"], d["problem"]) for d in body["drift"]] == [(drifting, "missing")]
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert "1 orphans" in table.stdout and "1 drifting files" in table.stdout
    assert any(OLD_KEY in line for line in lines)
    assert any(drifting in line and "missing" in line for line in lines)
    assert f"{body['scanned_objects']} objects scanned" in table.stdout


def test_delete_orphans_deletes_the_old_and_refuses_the_young(setup: Setup) -> None:
    old = stray(setup, OLD_KEY, age_s=2 * HOUR)
    young = stray(setup, YOUNG_KEY)

    result = setup.ckpt(
        "reconcile", "delete-orphans", f"hot:{OLD_KEY}", f"hot:{YOUNG_KEY}", "--json"
    )

    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [o["key"] for o in body["deleted"]] == [OLD_KEY]
    [refused] = body["refused"]
    assert refused["key"] == YOUNG_KEY and "less than" in refused["reason"]
    assert not old.exists() and young.exists()

    again = setup.ckpt("reconcile", "delete-orphans", "--all", COLUMNS="80")
    assert again.returncode == 0, again.stderr
    assert "0 orphans deleted" in again.stdout and "1 refused" in again.stdout
    assert any(YOUNG_KEY in line for line in again.stdout.splitlines())
    assert max(cell_len(line) for line in again.stdout.splitlines()) <= 80
    assert young.exists()


def test_delete_orphans_must_be_told_which(setup: Setup) -> None:
    for args in ((), (f"hot:{OLD_KEY}", "--all"), ("hot",)):
        result = setup.ckpt("reconcile", "delete-orphans", *args)
        assert result.returncode == 2, (args, result.stdout)
        assert "orphans" in result.stderr and "Traceback" not in result.stderr
