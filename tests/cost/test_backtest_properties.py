"""The backtest's promise, for any policy: the bytes it says the policy would have stored on
each day are the bytes a fresh catalog holds on that day when the same history is lived
through the real API with that policy enforced by sweeps.

Each example lives one script twice, on one database: project `h<n>` under the policy in
force (the history the backtest reads) and project `q<n>` under the drawn policy (the
catalog it must agree with)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from tests.builders import put_policy
from tests.conftest import empty
from tests.cost.history_driver import DAY, Catalog, Op, backtest, play, priced_app, series_bytes

DAYS = 14
H = timedelta(hours=1)
examples = itertools.count()


def at(day: int, hour: int) -> timedelta:
    return day * DAY + hour * H


def run(name: str, first: int, last: int, resumed_from: str | None = None) -> list[Op]:
    ops = [Op(at(first, 1), "start", name, resumed_from=resumed_from)]
    for day in range(first, last + 1):
        ops.append(Op(at(day, 6), "save", name, 10 * day + 1, "rolling"))
        if day % 3 == 2:
            ops.append(Op(at(day, 12), "save", name, 10 * day + 5, "milestone"))
    ops += [Op(at(last, 19), "save", name, 10 * last + 9, "final"), Op(at(last, 20), "end", name)]
    return ops


SCRIPT = [
    *run("x", 0, 8),
    *run("y", 5, 12, resumed_from="x/25"),
    Op(at(4, 10), "pin", "x", 25),
    Op(at(9, 10), "restore", "x", 55),
    Op(at(10, 11), "delete", "x", 85),
    Op(at(11, 9), "pin", "y", 85),
]

IN_FORCE: list[dict[str, Any]] = [
    {"name": "rolling", "class": "rolling", "keep_last": 2, "action": "delete"},
    {"name": "cool", "class": "milestone", "when": {"age": "3d"}, "action": {"move_to": "cold"}},
]

durations = st.sampled_from(["0s", "1d", "2d", "3d", "5d"])
tiers = st.sampled_from(["cold", "archive"])
actions = st.one_of(
    st.just("delete"), tiers.map(lambda t: {"move_to": t}), tiers.map(lambda t: {"copy_to": t})
)


@st.composite
def rules(draw: st.DrawFn) -> list[dict[str, Any]]:
    drawn: list[dict[str, Any]] = []
    for klass in ("rolling", "milestone", "final"):
        if not draw(st.booleans()):
            continue
        rule: dict[str, Any] = {"name": f"{klass}-rule", "class": klass, "action": draw(actions)}
        when = draw(st.sampled_from(["age", "run_ended", None]))
        if when is not None:
            rule["when"] = {when: draw(durations)}
        keep = draw(st.sampled_from(["keep_last", "keep_every", None]))
        if keep == "keep_last":
            rule["keep_last"] = draw(st.integers(0, 3))
        elif keep == "keep_every":
            rule["keep_every"] = {"steps": draw(st.sampled_from([20, 30]))}
        drawn.append(rule)
    return drawn


@pytest.fixture(scope="module")
def catalog_app(
    engine: Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, TestClient, Any]]:
    empty(engine)
    data_dir = tmp_path_factory.mktemp("property") / "data"
    app = priced_app(database_url, engine, data_dir)
    with TestClient(app) as client:
        yield app, client, data_dir


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=rules())
def test_backtest_bytes_equal_the_bytes_of_the_policy_enforced(
    catalog_app: tuple[Any, TestClient, Any], drawn: list[dict[str, Any]]
) -> None:
    app, client, data_dir = catalog_app
    n = next(examples)
    history, enforced = f"h{n}", f"q{n}"
    put_policy(client, _yaml(f"in-force-{n}", history, IN_FORCE))
    put_policy(client, _yaml(f"drawn-{n}", enforced, drawn))
    lived = Catalog(app, client, data_dir, project=history)
    fresh = Catalog(app, client, data_dir, project=enforced)
    play([lived, fresh], SCRIPT, DAYS)

    candidate = {"name": f"candidate-{n}", "applies_to": {"projects": [history]}, "rules": drawn}
    result = backtest(client, candidate, DAYS, project=history)
    assert series_bytes(result["actual"]["series"]) == lived.days
    assert series_bytes(result["series"]) == fresh.days


def _yaml(name: str, project: str, rules: list[dict[str, Any]]) -> str:
    return yaml.safe_dump({"name": name, "applies_to": {"projects": [project]}, "rules": rules})
