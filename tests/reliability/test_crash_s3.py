"""Workers killed by SIGKILL at every crash point of a move, copy and restore from a local
tier to S3, a class change in place on S3, and a purge of copies on S3 and GCS; real S3 and
GCS servers. The catalog is on SQLite: test_crash_local.py covers PostgreSQL's claim."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.reliability.harness import S3_SCENARIOS, Matrix, Scenario, World, check_scenario


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("scenario", S3_SCENARIOS, ids=lambda s: s.id)
def test_a_worker_killed_at_any_point_loses_nothing(
    object_world: World,
    engine: Engine,
    database_url: str,
    scenario: Scenario,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    record_property: Callable[[str, object], None],
) -> None:
    matrix = Matrix(object_world, engine, database_url, tmp_path)
    check_scenario(
        matrix, scenario, tmp_path_factory.getbasetemp() / "crash-injection", record_property
    )
