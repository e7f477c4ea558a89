"""Every crash point the executor declares is reached by some scenario of the crash matrix
(so the matrix kills a worker there): the reference runs of COVERAGE_SCENARIOS, traced. A
new crash point that none of them reaches fails here: add the scenario that reaches it to
the matrix and to COVERAGE_SCENARIOS."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.services.lifecycle.crash import POINTS
from tests.figures import FIGURES
from tests.reliability.harness import (
    COVERAGE_SCENARIOS,
    GCS_SCENARIOS,
    LOCAL_SCENARIOS,
    S3_SCENARIOS,
    Matrix,
    World,
    reference_trace,
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_declared_crash_point_is_reached_by_some_action(
    object_world: World,
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    record_property: Callable[[str, object], None],
) -> None:
    assert set(COVERAGE_SCENARIOS) <= set(LOCAL_SCENARIOS + S3_SCENARIOS + GCS_SCENARIOS)
    reached: dict[str, list[str]] = {}
    for scenario in COVERAGE_SCENARIOS:
        matrix = Matrix(object_world, engine, database_url, tmp_path)
        targets, violations = reference_trace(matrix, scenario)
        assert violations == [], scenario.id
        for name in sorted({t.name for t in targets}):
            reached.setdefault(name, []).append(scenario.id)

    report = tmp_path_factory.getbasetemp() / "crash-injection" / "points.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(reached, indent=2, sort_keys=True))
    assert sorted(reached) == sorted(POINTS), f"never reached: {set(POINTS) - set(reached)}"
    record_property(
        FIGURES, f"crash points: {len(reached)} of {len(POINTS)} declared are reached by actions"
    )
