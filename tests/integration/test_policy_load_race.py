"""Several replicas start at once and load the same policy files: none of them fails."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI

from app.bootstrap import load_policies_into
from app.services.catalog.policies import list_policy_rows
from app.settings import Settings


def test_replicas_loading_the_same_files_at_once_all_start(
    app: FastAPI, settings: Settings, data_dir: Path
) -> None:
    settings.policies_dir.mkdir(parents=True, exist_ok=True)
    for n in range(5):
        (settings.policies_dir / f"p{n}.yaml").write_text(
            f"name: p{n}\nrules:\n  - {{name: r, class: rolling, keep_last: 3, action: delete}}\n"
        )

    def start(_: int) -> None:
        load_policies_into(app.state.session_factory, settings, app.state.tiers)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(start, range(8)))  # re-raises the first failure

    with app.state.session_factory() as session:
        assert [row.name for row in list_policy_rows(session)] == [f"p{n}" for n in range(5)]
