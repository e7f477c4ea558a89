"""`ckpt backtest` as an admin runs it against a real service whose catalog lived 30
simulated days under the shipped default policy: the comparison table, the regrets, the
chart, and the same answer as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from typer.testing import Result

from app.settings import Settings
from tests.builders import with_tiers
from tests.cost.history_driver import DAY, START, STRICT, Catalog, Op, play, tiers_file
from tests.integration.cli_service import Service

DAYS = 30
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    priced = with_tiers(settings, tiers_file(settings.data_dir))
    return priced.model_copy(update={"trash_retention": timedelta(0)})


@pytest.fixture
def lived(service: Service) -> Iterator[Service]:
    ops = [Op(timedelta(hours=1), "start", "a")]
    for day in range(20):
        ops.append(Op(day * DAY + timedelta(hours=6), "save", "a", 10 * day + 1, "rolling"))
        if day % 5 == 4:
            ops.append(Op(day * DAY + timedelta(hours=7), "save", "a", 10 * day + 5, "milestone"))
    ops.append(Op(19 * DAY + timedelta(hours=20), "end", "a"))
    ops.append(Op(25 * DAY + timedelta(hours=9), "pin", "a", 95))  # strict deleted it
    with service.http() as client:
        catalog = Catalog(service.app, client, service.data_dir)
        play([catalog], ops, DAYS)
        service.run = catalog.runs["a"]
    yield service


def backtest(service: Service, *args: str) -> Result:
    with time_machine.travel(START + DAYS * DAY, tick=False):
        return service.invoke("backtest", *args, columns=200)


def test_backtest_prints_the_comparison_and_the_regrets_and_draws_them(
    lived: Service, tmp_path: Path
) -> None:
    policy = tmp_path / "strict.yaml"
    policy.write_text(STRICT)
    chart = tmp_path / "out" / "backtest.png"

    result = backtest(lived, "--policy", str(policy), "--project", "proj", "--chart", str(chart))

    assert result.exit_code == 0, result.output
    assert "backtest: policy strict, 1 run(s), 2026-03-02 .. 2026-04-01" in result.output
    assert "regrets: 1 checkpoint(s) it would have removed were used again" in result.output
    assert "2026-03-21 20:00" in result.output and "2026-03-27 09:00" in result.output
    assert "pinned" in result.output
    assert "savings +$" in result.output
    assert chart.read_bytes().startswith(PNG)


def test_backtest_as_json_is_the_service_s_answer(lived: Service, tmp_path: Path) -> None:
    result = backtest(lived, "--policy", "default", "--run-id", lived.run["id"], "--json",
                      "--no-chart", "--chart", str(tmp_path / "unwanted.png"))  # fmt: skip

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["policy"] == "default" and body["runs"] == 1
    assert len(body["series"]) == DAYS
    assert [d["bytes"] for d in body["series"]] == [d["bytes"] for d in body["actual"]["series"]]
    assert not (tmp_path / "unwanted.png").exists()


def test_an_unknown_policy_file_is_a_usage_error(lived: Service) -> None:
    result = backtest(lived, "--policy", "nowhere/strict.yaml", "--no-chart")
    assert result.exit_code == 2
    assert "no such file" in result.output
