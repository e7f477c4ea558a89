"""POST /v1/plan and `ckpt plan` show money (section 2: a dry run "with bytes and dollars"):
each action's `usd_month` (the monthly storage change it makes, negative for a saving) and
`one_off_usd` (early deletion, retrieval, egress, requests), and the plan's
`usd_month_by_tier` and `one_off_usd`. Every figure is worked here from the tiers' prices
and the checkpoints' sizes, never rounded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from typer.testing import CliRunner

from app.cli import cli
from app.settings import Settings
from tests.builders import (
    ago,
    end_run,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    with_tiers,
)
from tests.cost.conftest import cost_app
from tests.integration.cli_service import serve

GB = 10**9
# USD per GB-month, per 1,000 requests, minimum days: local tiers priced like S3 classes.
PRICES: dict[str, dict[str, float]] = {
    "hot": {"storage_gb_month": 0.023, "read_requests_per_1000": 0.4},
    "warm": {"storage_gb_month": 0.0125},
    "cold": {"storage_gb_month": 0.004, "min_storage_days": 90, "write_requests_per_1000": 20},
    "archive": {
        "storage_gb_month": 0.00099,
        "min_storage_days": 180,
        "write_requests_per_1000": 50,
    },
}
MONEY = """\
name: money
rules:
  - {name: roll, class: rolling, keep_last: 1, action: delete}
  - {name: cool, class: milestone, when: {run_ended: 1d}, action: {move_to: cold}}
  - {name: keep-final, class: final, when: {run_ended: 0s}, action: {copy_to: archive}}
"""
ROLLING, KEPT, MILESTONE, FINAL = 1_000_000, 2_000, 3_000_000, 4_000_000
AGE_DAYS = 9


def storage(tier: str, size: int) -> float:
    return size / GB * PRICES[tier]["storage_gb_month"]


def requests(source: str, target: str) -> float:
    """A read at the source and a write at the target, for one object."""
    read = PRICES[source].get("read_requests_per_1000", 0.0)
    write = PRICES[target].get("write_requests_per_1000", 0.0)
    return (read + write) / 1000


@pytest.fixture
def money_settings(settings: Settings, data_dir: Path) -> Settings:
    return with_tiers(
        settings,
        [
            {"name": name, "url": f"file://{(data_dir / name).resolve()}", "price": price}
            for name, price in PRICES.items()
        ],
    )


@pytest.fixture
def money_client(money_settings: Settings, clean_engine: Engine) -> Iterator[TestClient]:
    with TestClient(cost_app(money_settings, clean_engine)) as client:
        yield client


@dataclass
class Run:
    rolling: dict[str, Any]  # on hot with a replica on archive: deleted
    milestone: dict[str, Any]  # on hot: moved to cold
    final: dict[str, Any]  # on hot: copied to archive


@pytest.fixture
def ended_run(money_client: TestClient, data_dir: Path) -> Run:
    """A run ended 2 days ago; its checkpoints written 9 days ago."""
    put_policy(money_client, MONEY)
    run = make_run(money_client, "proj", "run-1", policy="money")

    def place(step: int, klass: str, size: int) -> dict[str, Any]:
        files = {"w": b"x" * size}
        created = ago(days=AGE_DAYS)
        return place_checkpoint(
            money_client, data_dir, run, step, klass, files=files, created_at=created
        )

    rolling = place(1, "rolling", ROLLING)
    place(2, "rolling", KEPT)
    milestone = place(3, "milestone", MILESTONE)
    final = place(4, "final", FINAL)
    restore = money_client.post(
        f"/v1/checkpoints/{rolling['id']}/restore", json={"tier": "archive"}
    )
    assert restore.status_code == 202, restore.text
    app: Any = money_client.app
    assert make_executor(app).drain() == 1
    end_run(money_client, run["id"], ago(days=2))
    return Run(rolling, milestone, final)


def test_each_action_and_the_totals_carry_their_dollars(
    money_client: TestClient, ended_run: Run
) -> None:
    response = money_client.post("/v1/plan", json={"project": "proj"})

    assert response.status_code == 200, response.text
    body = response.json()
    actions = {a["checkpoint_id"]: a for a in body["actions"]}
    delete = actions[ended_run.rolling["id"]]
    move = actions[ended_run.milestone["id"]]
    copy = actions[ended_run.final["id"]]
    assert len(actions) == 3
    assert (delete["kind"], move["kind"], copy["kind"]) == ("delete", "move", "copy")

    # The delete frees the primary on hot and the replica on archive, whose 180-day
    # minimum is 171 days short: the unserved days are charged on the replica's tier.
    assert delete["usd_month"] == pytest.approx(
        -storage("hot", ROLLING) - storage("archive", ROLLING), rel=1e-12
    )
    assert delete["one_off_usd"] == pytest.approx(
        storage("archive", ROLLING) * (180 - AGE_DAYS) / 30, rel=1e-4
    )
    # The move: (cold - hot) x bytes a month; a read on hot and a write on cold once.
    assert move["usd_month"] == pytest.approx(
        storage("cold", MILESTONE) - storage("hot", MILESTONE), rel=1e-12
    )
    assert move["one_off_usd"] == pytest.approx(requests("hot", "cold"), rel=1e-12)
    # The copy: + bytes at archive's price; a read on hot and a write on archive.
    assert copy["usd_month"] == pytest.approx(storage("archive", FINAL), rel=1e-12)
    assert copy["one_off_usd"] == pytest.approx(requests("hot", "archive"), rel=1e-12)

    totals = body["totals"]
    assert totals["deleted_bytes_by_tier"] == {"hot": ROLLING}  # by the source
    assert totals["moved_bytes_by_tier"] == {"hot": MILESTONE}  # by the source
    assert totals["copied_bytes_by_tier"] == {"archive": FINAL}  # by the destination
    assert totals["usd_month_by_tier"].keys() == {"hot", "cold", "archive"}
    by_tier = totals["usd_month_by_tier"]
    assert by_tier["hot"] == pytest.approx(-storage("hot", ROLLING + MILESTONE), rel=1e-12)
    assert by_tier["cold"] == pytest.approx(storage("cold", MILESTONE), rel=1e-12)
    assert by_tier["archive"] == pytest.approx(
        storage("archive", FINAL) - storage("archive", ROLLING), rel=1e-12
    )
    assert sum(by_tier.values()) == pytest.approx(
        sum(a["usd_month"] for a in body["actions"]), rel=1e-12
    )
    assert totals["one_off_usd"] == pytest.approx(
        sum(a["one_off_usd"] for a in body["actions"]), rel=1e-12
    )


def test_a_plan_on_free_tiers_costs_nothing(client: TestClient, data_dir: Path) -> None:
    """The default local tiers have no price: every tier touched is listed, at 0."""
    put_policy(client, MONEY)
    run = make_run(client, "proj", "run-1", policy="money")
    for step in (1, 2):
        place_checkpoint(client, data_dir, run, step)

    body = client.post("/v1/plan", json={}).json()

    (action,) = body["actions"]
    assert (action["usd_month"], action["one_off_usd"]) == (0.0, 0.0)
    assert body["totals"]["usd_month_by_tier"] == {"hot": 0.0}
    assert body["totals"]["one_off_usd"] == 0.0


def test_the_contract_says_how_each_total_is_keyed(money_client: TestClient) -> None:
    schema = money_client.get("/openapi.json").json()["components"]["schemas"]
    totals = schema["PlanTotals"]["properties"]
    action = schema["PlanActionRead"]["properties"]

    assert "keyed by the source" in totals["deleted_bytes_by_tier"]["description"]
    assert "keyed by the source" in totals["moved_bytes_by_tier"]["description"]
    assert "keyed by the destination" in totals["copied_bytes_by_tier"]["description"]
    assert "whose bill changes" in totals["usd_month_by_tier"]["description"]
    assert "saving starts at the purge" in action["usd_month"]["description"]
    assert {"usd_month", "one_off_usd"} <= set(action)


def test_ckpt_plan_prints_the_dollars_within_80_columns(
    money_settings: Settings, clean_engine: Engine, ended_run: Run
) -> None:
    """`ckpt plan` asks a real service (the same catalog served over HTTP) for the plan."""
    with serve(cost_app(money_settings, clean_engine)) as url:
        args = ["plan", "--project", "proj", "--url", url]
        table = CliRunner().invoke(cli, args, env={"COLUMNS": "80"})
        as_json = CliRunner().invoke(cli, [*args, "--json"])

    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert all(len(line) <= 80 for line in lines), table.output
    hot = -storage("hot", ROLLING + MILESTONE)
    cold = storage("cold", MILESTONE)
    archive = storage("archive", FINAL) - storage("archive", ROLLING)
    # Under a cent: two significant digits, never printed as $0.00.
    assert f"storage on hot: -${-hot:.2g}/month" in lines
    assert f"storage on cold: +${cold:.2g}/month" in lines
    assert f"storage on archive: +${archive:.2g}/month" in lines
    assert (
        f"storage in all: -${-(hot + cold + archive):.2g}/month, deletes saving from their purge"
        in lines
    )
    assert "deleted from hot: 1.0 MB" in lines and "copied to archive: 4.0 MB" in lines
    assert any(line.startswith("one-off charges: $") for line in lines)

    assert as_json.exit_code == 0, as_json.output
    printed = json.loads(as_json.stdout)
    actions = {a["checkpoint_id"]: a for a in printed["actions"]}
    assert actions[ended_run.final["id"]]["usd_month"] == pytest.approx(
        storage("archive", FINAL), rel=1e-12
    )
    assert printed["totals"]["usd_month_by_tier"]["cold"] == pytest.approx(cold, rel=1e-12)
