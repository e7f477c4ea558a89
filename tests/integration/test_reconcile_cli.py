"""`ckpt reconcile` and `ckpt reconcile delete-orphans` against a real service, on local
tiers with objects left behind and files lost."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.cells import cell_len

from tests.builders import issue_token
from tests.integration.cli_service import Service

HOUR = 3600.0
OLD_KEY = "llm/run-1/step-9-crashed-upload/model-00001-of-00008.safetensors"
YOUNG_KEY = "llm/run-1/step-6/being-written.bin"


def stray(catalog: Service, key: str, age_s: float = 0) -> Path:
    """An object on the hot tier that no checkpoint owns, last written `age_s` ago."""
    path = catalog.data_dir / "hot" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left behind")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def lose_a_file(catalog: Service, step: int) -> str:
    """Remove one catalogued file of `step`; its checkpoint drifts."""
    root = catalog.data_dir / "hot" / "llm" / "run-1" / f"step-{step}"
    victim = sorted(p for p in root.rglob("*") if p.is_file())[0]
    victim.unlink()
    return str(catalog.ckpts[step]["id"])


def test_reconcile_at_80_columns_shows_whole_keys_and_ids_as_json_does(catalog: Service) -> None:
    stray(catalog, OLD_KEY, age_s=2 * HOUR)
    drifting = lose_a_file(catalog, 4)

    document = catalog.invoke("reconcile", "--json")
    table = catalog.invoke("reconcile", columns=80)

    assert document.exit_code == 0 and table.exit_code == 0, (document.output, table.output)
    body = json.loads(document.stdout)
    assert [(o["tier"], o["key"]) for o in body["orphans"]] == [("hot", OLD_KEY)]
    assert [(d["checkpoint_id"], d["problem"]) for d in body["drift"]] == [(drifting, "missing")]
    lines = table.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert "1 orphans" in table.stdout and "1 drifting files" in table.stdout
    assert any(OLD_KEY in line for line in lines)
    assert any(drifting in line and "missing" in line for line in lines)
    assert f"{body['scanned_objects']} objects scanned" in table.stdout


def test_delete_orphans_deletes_the_old_and_refuses_the_young(catalog: Service) -> None:
    old = stray(catalog, OLD_KEY, age_s=2 * HOUR)
    young = stray(catalog, YOUNG_KEY)

    result = catalog.invoke(
        "reconcile", "delete-orphans", f"hot:{OLD_KEY}", f"hot:{YOUNG_KEY}", "--json"
    )

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert [o["key"] for o in body["deleted"]] == [OLD_KEY]
    [refused] = body["refused"]
    assert refused["key"] == YOUNG_KEY and "less than" in refused["reason"]
    assert not old.exists() and young.exists()

    again = catalog.invoke("reconcile", "delete-orphans", "--all", columns=80)
    assert again.exit_code == 0, again.output
    assert "0 orphans deleted" in again.stdout and "1 refused" in again.stdout
    assert any(YOUNG_KEY in line for line in again.stdout.splitlines())
    assert max(cell_len(line) for line in again.stdout.splitlines()) <= 80
    assert young.exists()


def test_delete_orphans_must_be_told_which(catalog: Service) -> None:
    for args in ((), (f"hot:{OLD_KEY}", "--all"), ("hot",)):
        result = catalog.invoke("reconcile", "delete-orphans", *args)
        assert result.exit_code == 2, (args, result.stdout)
        assert "orphans" in result.stderr and "Traceback" not in result.output


def test_an_unknown_tier_and_a_read_token_are_refused(catalog: Service) -> None:
    _id, reader = issue_token(catalog.app, name="reader", scopes=("read",), projects=("*",))

    unknown = catalog.invoke("reconcile", "delete-orphans", f"moon:{OLD_KEY}")
    scan = catalog.invoke("reconcile", token=reader)

    assert unknown.exit_code == 1
    assert unknown.stderr == "ckpt: Unprocessable entity: orphans[0].tier: unknown tier 'moon'\n"
    assert scan.exit_code == 1
    assert scan.stderr == "ckpt: Forbidden: this token lacks the admin scope\n"
