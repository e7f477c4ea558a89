"""An adopted tree is evaluated like any registration, once it is whole: the blast-radius
hold stands between a thinning policy and a freshly adopted tree of old milestones."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.builders import ledger, put_policy
from tests.imports.trees import (
    Tree,
    catalog,
    generic_tree,
    hf_tree,
    run_import,
    stamp,
    write_local,
)

SHIPPED = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def test_adopting_500_old_milestones_holds_the_thinning_for_an_admin(
    app: FastAPI, client: TestClient, data_dir: Path
) -> None:
    # thins milestones to the best 5 by eval_loss and the last, 7 days after the run ends
    put_policy(client, SHIPPED.read_text())
    tree: Tree = {}
    for run in range(5):  # no run alone weighs half the project: only the whole tree does
        tree |= hf_tree(f"exp-{run}", range(1, 101))  # eval_loss falls: the last 5 are best
    root = data_dir / "hot" / "2025"
    write_local(root, tree, mtime=stamp(2025, 6, 1))

    adopted = run_import(app, client, uri=f"file://{root}", project="research")
    assert adopted["state"] == "done" and adopted["registered"] == 500
    assert adopted["sweep_id"] is not None

    deletes = [a for a in ledger(client, kind="delete") if a["state"] != "cancelled"]
    assert len(deletes) == 5 * 95  # all but the best 5 of each run (the last among them)
    assert {a["state"] for a in deletes} == {"held"}
    assert {a["sweep_id"] for a in deletes} == {adopted["sweep_id"]}
    assert {a["rule"] for a in deletes} == {"default/milestones-thin"}
    adopted_tree = catalog(client, "research")
    assert {c["state"] for c in adopted_tree.values()} == {"active"}
    # steps come from the numbers, not from the names' order (`checkpoint-100` lists
    # before `checkpoint-11`): what the thinning keeps is each run's newest five
    doomed = {a["checkpoint_id"] for a in deletes}
    kept = {key for key, c in adopted_tree.items() if c["id"] not in doomed}
    assert kept == {(f"exp-{run}", step) for run in range(5) for step in range(96, 101)}
    assert sum(1 for p in root.rglob("*") if p.is_file()) == len(tree)


def test_a_dry_run_evaluates_nothing(app: FastAPI, client: TestClient, data_dir: Path) -> None:
    put_policy(client, SHIPPED.read_text())
    root = data_dir / "hot" / "old"
    write_local(root, generic_tree("exp", range(1, 21)), mtime=stamp(2025, 6, 1))
    dry = run_import(app, client, uri=f"file://{root}", project="research", dry_run=True)
    assert dry["registered"] == 20 and dry["sweep_id"] is None
    assert ledger(client) == []
