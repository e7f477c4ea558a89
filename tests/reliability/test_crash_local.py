"""Workers killed by SIGKILL at every crash point of every action kind on local tiers
(DESIGN section 8, invariants 2 and 3): every scenario on SQLite, and on PostgreSQL (whose
claim of a dead worker's action goes through SELECT ... FOR UPDATE SKIP LOCKED) one
scenario for each function of the executor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.reliability.harness import (
    LOCAL_SCENARIOS,
    POSTGRES_SCENARIOS,
    Matrix,
    Scenario,
    World,
    check_scenario,
)

CASES = [
    *(pytest.param("sqlite", s, id=f"sqlite-{s.id}") for s in LOCAL_SCENARIOS),
    *(pytest.param("postgresql", s, id=f"postgresql-{s.id}") for s in POSTGRES_SCENARIOS),
]


@pytest.mark.parametrize(("database_url", "scenario"), CASES, indirect=["database_url"])
def test_a_worker_killed_at_any_point_loses_nothing(
    local_world: World,
    engine: Engine,
    database_url: str,
    scenario: Scenario,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    record_property: Callable[[str, object], None],
) -> None:
    matrix = Matrix(local_world, engine, database_url, tmp_path)
    check_scenario(
        matrix, scenario, tmp_path_factory.getbasetemp() / "crash-injection", record_property
    )
