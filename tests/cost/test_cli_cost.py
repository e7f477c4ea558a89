"""`ckpt report`, `ckpt forecast` and `ckpt planner` as an operator runs them, against a real
service with the shipped default policy (SQLite and PostgreSQL): readable tables, JSON,
and the forecast chart, drawn here from the service's answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import Result

from app.cli import cost
from app.cost.prices import catalog
from app.services.cost import report
from tests.integration.cli_service import Service

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def ckpt(service: Service) -> Service:
    return service


def run(service: Service, *args: str) -> Result:
    return service.invoke(*args, columns=200)


def test_forecast_prints_the_worked_example_and_draws_it(ckpt: Service, tmp_path: Path) -> None:
    chart = tmp_path / "out" / "forecast.png"

    result = run(
        ckpt, "forecast", "--checkpoint-bytes", "1e12", "--run-days", "45",
        "--price", "*=0.023", "--chart", str(chart),
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert "at run end: 49.0 TB, $1,127.00/month" in result.output
    assert "keeping everything: 406.0 TB, $9,338.00/month" in result.output
    assert chart.read_bytes().startswith(PNG)


def test_forecast_as_json_for_twenty_runs_of_a_70b_model(ckpt: Service, tmp_path: Path) -> None:
    result = run(
        ckpt, "forecast", "--parameters", "70e9", "--bytes-per-parameter", "12",
        "--run-days", "45", "--concurrent-runs", "20", "--price", "*=0.023", "--json",
        "--no-chart", "--chart", str(tmp_path / "unwanted.png"),
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["checkpoint_bytes"] == 840 * 10**9  # 70B at 12 bytes per parameter
    assert body["at_run_end"]["bytes"] == 20 * 49 * 840 * 10**9
    assert body["at_run_end"]["usd_month"] == pytest.approx(22_540.0 * 0.84)
    assert not (tmp_path / "unwanted.png").exists()


def test_forecast_from_a_policy_file_with_a_catalog_price(ckpt: Service, tmp_path: Path) -> None:
    policy = tmp_path / "what-if.yaml"
    policy.write_text(
        "name: what-if\nrules:\n"
        "  - {name: roll, class: rolling, keep_last: 2, action: delete}\n"
        "  - {name: cool, class: milestone, when: {run_ended: 1d}, action: {move_to: cold}}\n"
    )

    result = run(
        ckpt, "forecast", "--checkpoint-bytes", "1e12", "--run-days", "10",
        "--schedule", "rolling=6h", "--schedule", "milestone=1d", "--policy", str(policy),
        "--price", "hot=aws/STANDARD", "--price", "cold=aws/GLACIER_IR", "--json", "--no-chart",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["policy"] == "what-if"
    assert body["at_run_end"]["bytes"] == (2 + 10) * 10**12
    assert body["series"][-1]["bytes_by_tier"]["cold"] == 10 * 10**12
    assert body["prices"]["cold"]["catalog"] == "aws/GLACIER_IR"


def test_a_star_price_means_what_it_means_to_the_api(ckpt: Service) -> None:
    """`--price '*=USD'` and the API's `"prices": {"*": ...}` are one what-if: a tier named
    too wins over the star whichever comes first, on the command line as over HTTP."""
    args = ["forecast", "--checkpoint-bytes", "1e12", "--run-days", "10", "--json", "--no-chart"]
    star_last = run(ckpt, *args, "--price", "cold=aws/GLACIER_IR", "--price", "*=0.023")
    star_first = run(ckpt, *args, "--price", "*=0.023", "--price", "cold=aws/GLACIER_IR")
    with ckpt.http() as client:
        response = client.post(
            "/v1/forecast",
            json={
                "checkpoint_bytes": 10**12,
                "run_days": 10,
                "schedule": {"rolling": "3h", "milestone": "1d", "final": "end"},
                "prices": {"*": {"storage_gb_month": 0.023}, "cold": {"catalog": "aws/GLACIER_IR"}},
            },
        )

    assert star_last.exit_code == star_first.exit_code == 0, star_last.output
    assert response.status_code == 200, response.text
    answers = [json.loads(star_last.stdout), json.loads(star_first.stdout), response.json()]
    assert answers[0] == answers[1] == answers[2]
    prices = answers[0]["prices"]
    assert prices["cold"]["catalog"] == "aws/GLACIER_IR"
    assert (
        prices["cold"]["storage_gb_month"]
        == catalog()["aws/GLACIER_IR"].figures["storage_gb_month"]
    )
    assert {tier: q["storage_gb_month"] for tier, q in prices.items() if tier != "cold"} == {
        "hot": 0.023,
        "warm": 0.023,
        "archive": 0.023,
    }


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--run-days", "45"], 1, "checkpoint_bytes"),
        (["--checkpoint-bytes", "1e12", "--run-days", "45", "--policy", "nope"], 1, "no policy"),
        (
            ["--checkpoint-bytes", "1e12", "--run-days", "45", "--schedule", "rolling"],
            2,
            "NAME=VALUE",
        ),
        (["--checkpoint-bytes", "1.5", "--run-days", "45"], 1, "whole number"),
        (["--checkpoint-bytes", "1e12", "--run-days", "45", "--price", "moon=1"], 1, "moon"),
    ],
)
def test_forecast_refuses_bad_input(
    ckpt: Service, args: list[str], code: int, message: str
) -> None:
    """What the service refuses exits 1 with its problem; what is malformed on the command
    line never leaves it (exit 2)."""
    result = run(ckpt, "forecast", "--no-chart", *args)
    assert result.exit_code == code, result.output
    [line] = result.stderr.splitlines()
    assert message in line and line.startswith("ckpt: ")
    assert result.stdout == ""


def test_planner(ckpt: Service) -> None:
    result = run(
        ckpt, "planner", "--parameters", "70e9", "--interval", "1h", "--allowed-overlap", "0.1",
        "--write-seconds", "60", "--mtbf", "24h", "--checkpoints", "1000", "--gpus", "8",
        "--usd-per-gpu-hour", "4.06",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert "checkpoint size: 980.0 GB (14 bytes per parameter)" in result.output
    assert "write bandwidth: 2.7 GB/s" in result.output
    assert "Young/Daly interval: 3,220 s" in result.output
    assert "synchronous stall: 133.3 GPU-hours" in result.output
    assert "synchronous stall cost: $541.33" in result.output


def test_planner_json_and_refusals(ckpt: Service) -> None:
    result = run(ckpt, "planner", "--parameters", "405e9", "--recipe", "fp32-master-adam", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "bytes_per_parameter": 12.0,
        "checkpoint_bytes": 4_860_000_000_000,
        "incomplete": {},
    }
    refused = run(ckpt, "planner", "--recipe", "fp32-master-adam")
    assert refused.exit_code == 1 and "only with parameters" in refused.stderr


def test_report(ckpt: Service) -> None:
    table = run(ckpt, "report")
    assert table.exit_code == 0, table.output
    assert "cost by tier" in table.output and "total: 0 B, $0.00/month" in table.output

    body = json.loads(run(ckpt, "report", "--group-by", "class", "--json").stdout)
    assert body == {
        "group_by": "class",
        "rows": [],
        "total_bytes": 0,
        "total_usd_month": 0.0,
        "deleted_billed_bytes": 0,
        "deleted_billed_usd_month": 0.0,
        "prices": body["prices"],
    }
    assert set(body["prices"]) == {"hot", "warm", "cold", "archive"}
    assert run(ckpt, "report", "--group-by", "colour").exit_code == 2


def test_without_matplotlib_the_forecast_says_which_extra_to_install(
    ckpt: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server image has no matplotlib (the `chart` extra): the forecast says so before
    it prints anything, and still answers with --no-chart."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    chart = tmp_path / "forecast.png"
    args = ["forecast", "--checkpoint-bytes", "1e12", "--run-days", "45", "--price", "*=0.023"]

    refused = run(ckpt, *args, "--chart", str(chart))
    answered = run(ckpt, *args, "--no-chart")

    assert refused.exit_code == 2  # it would never draw: said before anything is asked
    assert "pip install 'ckpt-lifecycle[chart]'" in refused.output
    assert "at run end" not in refused.output and not chart.exists()
    assert answered.exit_code == 0, answered.output
    assert "at run end: 49.0 TB, $1,127.00/month" in answered.output


def test_the_command_knows_the_report_s_groups() -> None:
    """`--group-by` is checked before asking, against the groups the service offers."""
    assert cost.GROUPS == report.GROUPS


def test_forecast_with_and_without_soft_delete(ckpt: Service) -> None:
    """`--billed-after-delete hot=7d`: the worked example's 357 rolling deletes stay billed a
    week each, 56 of them at run end (8 a day); `forever` is the API's null."""
    args = ["forecast", "--checkpoint-bytes", "1e12", "--run-days", "45", "--price", "*=0.023"]

    week = run(ckpt, *args, "--no-chart", "--billed-after-delete", "hot=7d")
    forever = run(ckpt, *args, "--no-chart", "--json", "--billed-after-delete", "*=forever")

    assert week.exit_code == 0, week.output
    assert "at run end: 49.0 TB + 56.0 TB deleted, still billed, $2,415.00/month" in week.output
    assert "deleted, billed" in week.output  # the table's column
    assert forever.exit_code == 0, forever.output
    body = json.loads(forever.stdout)
    assert set(body["billed_after_delete"].values()) == {None}
    assert body["series"][-1]["deleted_billed_bytes"] > 0


def test_the_report_marks_what_is_deleted_but_billed(capsys: pytest.CaptureFixture[str]) -> None:
    body = {
        "group_by": "tier",
        "rows": [
            {"key": "hot", "name": None, "kind": "stored", "bytes": 10**12, "checkpoints": 1,
             "trashed_bytes": 0, "usd_month": 23.0, "billed_until": None},
            {"key": "hot", "name": None, "kind": "deleted_billed", "bytes": 2 * 10**12,
             "checkpoints": 2, "trashed_bytes": 0, "usd_month": 46.0,
             "billed_until": "2026-12-17T00:00:00Z"},
        ],
        "total_bytes": 3 * 10**12,
        "total_usd_month": 69.0,
        "deleted_billed_bytes": 2 * 10**12,
        "deleted_billed_usd_month": 46.0,
    }  # fmt: skip

    cost.render_report(body)

    out = capsys.readouterr().out
    assert "hot (deleted, still billed)" in out
    assert "total: 3.0 TB, $69.00/month, of which deleted but still billed: 2.0 TB, $46.00" in out
