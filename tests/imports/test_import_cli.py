"""`ckpt import` and `ckpt imports` against a real service (uvicorn on a free port, auth
on): the dry run's listing, the summary, --json, a second run, and refusals."""

from __future__ import annotations

import json

from rich.cells import cell_len

from tests.imports.trees import generic_tree, hf_tree, write_local
from tests.integration.cli_service import Service


def test_dry_run_lists_what_the_import_then_registers(service: Service) -> None:
    tree = hf_tree("outputs/bert", [10, 20]) | generic_tree("sweep/lr-3e-4", [5])
    tree["outputs/bert/checkpoint-30/model.safetensors"] = b"torn"  # no trainer_state.json
    tree["notes.txt"] = b"hello"
    write_local(service.data_dir / "hot" / "old", tree)
    uri = f"file://{(service.data_dir / 'hot' / 'old').resolve()}"

    dry = service.invoke("import", uri, "--project", "nlp", "--dry-run", columns=80)
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert "3 checkpoints would be registered" in dry.stdout
    assert any("outputs/bert/checkpoint-30" in line and "trainer_state" in line for line in lines)
    assert "notes.txt" in dry.stdout  # listed as unrecognised

    real = service.invoke("import", uri, "--project", "nlp", "--json")
    assert real.exit_code == 0, real.output
    body = json.loads(real.stdout)
    assert body["state"] == "done" and body["registered"] == 3 and body["incomplete_count"] == 1
    assert sorted((i["run"], i["step"]) for i in body["items"]) == [
        ("bert", 10),
        ("bert", 20),
        ("lr-3e-4", 5),
    ]
    with service.http() as client:
        runs = client.get("/v1/runs", params={"project": "nlp"}).json()["items"]
    assert sorted(r["name"] for r in runs) == ["bert", "lr-3e-4"]

    again = service.invoke("import", uri, "--project", "nlp")
    assert again.exit_code == 0, again.output
    assert "already catalogued" in again.stdout
    summary = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in again.stdout.splitlines()
        if line.count("│") >= 3
    }
    assert summary["registered"].startswith("0 ") and summary["already catalogued"] == "3"

    listed = service.invoke("imports", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [i["dry_run"] for i in json.loads(listed.stdout)] == [False, False, True]
    shown = service.invoke("imports", "show", body["id"], "--json")
    assert json.loads(shown.stdout)["registered"] == 3


def test_refusals_are_one_line_naming_the_field(service: Service) -> None:
    outside = service.invoke("import", "file:///nowhere/at/all", "--project", "p")
    assert outside.exit_code != 0
    assert "uri" in outside.output and "Traceback" not in outside.output
    bad_layout = service.invoke(
        "import", f"file://{service.data_dir}/hot", "--project", "p", "--layout", "keras"
    )
    assert bad_layout.exit_code != 0 and "layout" in bad_layout.output
    reader = service.invoke("imports", "list", token="")
    assert reader.exit_code != 0
