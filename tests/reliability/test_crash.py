"""Workers killed by SIGKILL at every crash point of every action kind (DESIGN section 8,
invariants 2 and 3), on three worlds:

- local tiers: every scenario on SQLite, and on PostgreSQL (whose claim of a dead worker's
  action goes through SELECT ... FOR UPDATE SKIP LOCKED) one scenario for each function of
  the executor;
- S3: a move, copy and restore from a local tier to S3, a class change in place on S3, and
  a purge of copies on S3 and GCS;
- GCS: a move, copy and restore from S3 GLACIER (restored before it is read) to GCS, and
  from GCS to a local tier.

S3 and GCS are real servers; their catalog is on SQLite, since the claim does not depend
on the tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.reliability.harness import (
    GCS_SCENARIOS,
    LOCAL_SCENARIOS,
    POSTGRES_SCENARIOS,
    S3_SCENARIOS,
    Matrix,
    Scenario,
    World,
    check_scenario,
)

CASES = [
    *(pytest.param("local_world", "sqlite", s, id=f"sqlite-{s.id}") for s in LOCAL_SCENARIOS),
    *(
        pytest.param("local_world", "postgresql", s, id=f"postgresql-{s.id}")
        for s in POSTGRES_SCENARIOS
    ),
    *(pytest.param("object_world", "sqlite", s, id=f"s3-{s.id}") for s in S3_SCENARIOS),
    *(pytest.param("object_world", "sqlite", s, id=f"gcs-{s.id}") for s in GCS_SCENARIOS),
]


@pytest.mark.parametrize(("world", "database_url", "scenario"), CASES, indirect=["database_url"])
def test_a_worker_killed_at_any_point_loses_nothing(
    world: str,
    engine: Engine,
    database_url: str,
    scenario: Scenario,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    record_property: Callable[[str, object], None],
) -> None:
    tiers: World = request.getfixturevalue(world)
    matrix = Matrix(tiers, engine, database_url, tmp_path)
    check_scenario(
        matrix, scenario, tmp_path_factory.getbasetemp() / "crash-injection", record_property
    )
