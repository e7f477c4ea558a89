"""Deleted but still billed (DESIGN section 16), over HTTP on a real catalog (SQLite and
PostgreSQL) with GCS tiers on fake-gcs-server: `hot` keeps deleted objects 7 days (soft
delete), `versions` keeps old versions that nothing expires, `cold` is a local directory.

The bytes the worker removes from such a tier (a purge, a move's source) are rows of their
own kind in the cost report while the provider bills them; a forecast asks the same policy
with and without soft delete; a plan says when a delete's or a move's saving starts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api import deps
from app.settings import Settings
from tests.builders import (
    assert_problem,
    file_entries,
    instant,
    iso,
    make_executor,
    make_run,
    put_policy,
    register,
    sweep_now,
    with_tiers,
)
from tests.cost.conftest import cost_app
from tests.storage.gcs_server import GcsEndpoint, anonymous_client
from tests.storage.gcs_server import new_bucket as new_gcs_bucket

GB = 1e9
PRICES = {"hot": 0.02, "versions": 0.01, "cold": 0.004}  # USD per GB-month
SOFT_DELETE = timedelta(days=7)
COOL = """\
name: cool
rules:
  - {name: cool, class: milestone, action: {move_to: cold}}
"""
ROLL = """\
name: roll
rules:
  - {name: roll, class: rolling, keep_last: 1, action: delete}
  - {name: cool, class: milestone, action: {move_to: cold}}
"""


def usd(size: int, tier: str) -> float:
    return size / GB * PRICES[tier]


@pytest.fixture
def buckets(fake_gcs: GcsEndpoint) -> dict[str, str]:
    return {tier: new_gcs_bucket(fake_gcs, tier) for tier in ("hot", "versions")}


@pytest.fixture
def gcs_app(
    settings: Settings, clean_engine: Engine, data_dir: Path, buckets: dict[str, str]
) -> FastAPI:
    tiers: list[dict[str, Any]] = [
        {
            "name": "hot",
            "url": f"gs://{buckets['hot']}/ckpt",
            "soft_delete": "7d",
            "price": {"storage_gb_month": PRICES["hot"]},
        },
        {
            "name": "versions",
            "url": f"gs://{buckets['versions']}/ckpt",
            "versioned": True,
            "keep_versions": True,
            "price": {"storage_gb_month": PRICES["versions"]},
        },
        {
            "name": "cold",
            "url": f"file://{(data_dir / 'cold').resolve()}",
            "price": {"storage_gb_month": PRICES["cold"]},
        },
    ]
    return cost_app(with_tiers(settings, tiers), clean_engine)


@pytest.fixture
def client(gcs_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(gcs_app) as test_client:
        yield test_client


class Place:
    """Writes a checkpoint's objects into a tier's bucket and registers them."""

    def __init__(self, client: TestClient, fake_gcs: GcsEndpoint, buckets: dict[str, str]):
        self.client = client
        self.gcs = anonymous_client(fake_gcs.url)
        self.buckets = buckets

    def __call__(
        self, run: dict[str, Any], step: int, klass: str, tier: str, size: int
    ) -> dict[str, Any]:
        files = {"model.bin": bytes([step % 256]) * size}
        key = f"ckpt/{run['project']}/{run['name']}/step-{step}"
        for path, data in files.items():
            self.gcs.bucket(self.buckets[tier]).blob(f"{key}/{path}").upload_from_string(data)
        response = register(
            self.client,
            run["id"],
            step,
            f"gs://{self.buckets[tier]}/{key}",
            klass,
            files=file_entries(files),
            created_at=iso(datetime.now(UTC) - timedelta(hours=1)),
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body


@pytest.fixture
def place(client: TestClient, fake_gcs: GcsEndpoint, buckets: dict[str, str]) -> Place:
    return Place(client, fake_gcs, buckets)


def drain(app: FastAPI) -> None:
    """Run the worker until nothing is due: deletes, the purges they enqueue, moves."""
    while make_executor(app, trash_retention=timedelta(0)).drain():
        pass


def report(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/reports/cost", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def by_kind(body: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(r["kind"], r["key"]): (r["bytes"], r["checkpoints"]) for r in body["rows"]}


@pytest.fixture
def removed(client: TestClient, gcs_app: FastAPI, place: Place) -> dict[str, Any]:
    """proj/run-1: a rolling checkpoint on hot (1,000 bytes) and one on versions (500)
    deleted and purged, a milestone (3,000) moved from hot to cold, one rolling (200) left
    on hot. other/run-1: a rolling checkpoint on hot (700) deleted and purged."""
    put_policy(client, COOL)
    run = make_run(client, "proj", "run-1", policy="cool")
    other = make_run(client, "other", "run-1")
    gone = [
        place(run, 1, "rolling", "hot", 1000),
        place(run, 3, "rolling", "versions", 500),
        place(other, 1, "rolling", "hot", 700),
    ]
    place(run, 2, "milestone", "hot", 3000)
    place(run, 4, "rolling", "hot", 200)
    before = datetime.now(UTC)
    for checkpoint in gone:
        assert client.delete(f"/v1/checkpoints/{checkpoint['id']}").status_code == 202
    assert len(sweep_now(client, run_id=run["id"])["actions"]) == 1  # the move to cold
    drain(gcs_app)
    after = datetime.now(UTC)
    states = {client.get(f"/v1/checkpoints/{c['id']}").json()["state"] for c in gone}
    assert states == {"deleted"}
    return {"run": run, "before": before, "after": after}


def test_removed_bytes_are_billed_in_rows_of_their_own(
    client: TestClient, removed: dict[str, Any]
) -> None:
    body = report(client, group_by="tier")

    assert [(r["kind"], r["key"]) for r in body["rows"]] == [
        ("stored", "hot"),
        ("stored", "versions"),
        ("stored", "cold"),
        ("deleted_billed", "hot"),
        ("deleted_billed", "versions"),
    ]
    assert by_kind(body) == {
        ("stored", "hot"): (200, 1),
        ("stored", "versions"): (0, 0),
        ("stored", "cold"): (3000, 1),  # the milestone, moved
        ("deleted_billed", "hot"): (1000 + 700 + 3000, 3),  # purged twice, moved off once
        ("deleted_billed", "versions"): (500, 1),
    }
    rows = {(r["kind"], r["key"]): r for r in body["rows"]}
    hot = rows["deleted_billed", "hot"]
    assert hot["usd_month"] == pytest.approx(usd(4700, "hot"), rel=1e-12)
    until = instant(hot["billed_until"])
    assert removed["before"] + SOFT_DELETE <= until <= removed["after"] + SOFT_DELETE
    assert rows["deleted_billed", "versions"]["billed_until"] is None  # nothing expires them
    assert rows["stored", "hot"]["billed_until"] is None
    deleted_usd = usd(4700, "hot") + usd(500, "versions")
    assert body["deleted_billed_bytes"] == 5200
    assert body["deleted_billed_usd_month"] == pytest.approx(deleted_usd, rel=1e-12)
    assert body["total_bytes"] == 200 + 3000 + 5200
    assert body["total_usd_month"] == pytest.approx(
        usd(200, "hot") + usd(3000, "cold") + deleted_usd, rel=1e-12
    )


def test_grouped_by_project_run_and_class(client: TestClient, removed: dict[str, Any]) -> None:
    run = removed["run"]
    by_project = report(client, group_by="project")
    assert by_kind(by_project) == {
        ("stored", "proj"): (3200, 2),
        ("deleted_billed", "proj"): (4500, 3),
        ("deleted_billed", "other"): (700, 1),
    }
    by_run = report(client, group_by="run", project="proj")
    assert by_kind(by_run) == {
        ("stored", run["id"]): (3200, 2),
        ("deleted_billed", run["id"]): (4500, 3),
    }
    assert {r["name"] for r in by_run["rows"]} == {"proj/run-1"}
    by_class = report(client, group_by="class")
    assert by_kind(by_class) == {
        ("stored", "milestone"): (3000, 1),
        ("stored", "rolling"): (200, 1),
        ("deleted_billed", "milestone"): (3000, 1),
        ("deleted_billed", "rolling"): (2200, 3),
    }
    totals = {b["total_usd_month"] for b in (by_project, by_class)}
    assert all(t == pytest.approx(report(client)["total_usd_month"], rel=1e-12) for t in totals)


def test_once_the_provider_lets_go_they_cost_nothing(
    client: TestClient, gcs_app: FastAPI, removed: dict[str, Any]
) -> None:
    """A week and a day later the soft-deleted bytes are gone from the bill; old versions
    nothing expires are not."""
    later = removed["after"] + SOFT_DELETE + timedelta(days=1)
    gcs_app.dependency_overrides[deps._now] = lambda: later
    try:
        body = report(client, group_by="tier")
    finally:
        gcs_app.dependency_overrides.clear()

    deleted = {k: v for k, v in by_kind(body).items() if k[0] == "deleted_billed"}
    assert deleted == {("deleted_billed", "versions"): (500, 1)}
    assert body["deleted_billed_usd_month"] == pytest.approx(usd(500, "versions"), rel=1e-12)


# --- forecasts -----------------------------------------------------------------------------

WORKED_EXAMPLE: dict[str, Any] = {
    "checkpoint_bytes": 1e12,
    "run_days": 45,
    "schedule": {"rolling": "3h", "milestone": "1d", "final": "end"},
    "policy": {
        "name": "rolling-only",
        "rules": [{"name": "roll", "class": "rolling", "keep_last": 3, "action": "delete"}],
    },
    "prices": {"*": {"storage_gb_month": 0.023}},
}


def forecast(client: TestClient, **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/forecast", json={**WORKED_EXAMPLE, **changes})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_forecast_with_and_without_the_tiers_soft_delete(client: TestClient) -> None:
    """The tiers' own settings by default (hot: 7 days), `0s` to ask without: 357 rolling
    deletes (360 written, 3 kept), each billed 7 more days, 8 of them a day."""
    with_soft = forecast(client)
    without = forecast(client, billed_after_delete={"hot": "0s"})
    tb = 10**12

    assert with_soft["billed_after_delete"] == {"hot": "1w", "versions": None, "cold": "0s"}
    assert without["billed_after_delete"]["hot"] == "0s"
    assert without["at_run_end"]["bytes"] == with_soft["at_run_end"]["bytes"] == 49 * tb
    assert without["at_run_end"]["deleted_billed_bytes"] == 0
    assert with_soft["at_run_end"]["deleted_billed_bytes"] == 7 * 8 * tb
    assert with_soft["at_run_end"]["deleted_billed_bytes_by_tier"]["hot"] == 56 * tb
    assert with_soft["at_run_end"]["usd_month"] == pytest.approx((49 + 56) * 23)
    extra = (360 - 3) * 7 * 23 / 30  # TB-days at $23 per TB-month
    assert with_soft["deleted_billed_usd"] == pytest.approx(extra)
    assert with_soft["total_usd"] == pytest.approx(without["total_usd"] + extra)
    assert with_soft["savings_usd"] == pytest.approx(without["savings_usd"] - extra)


def test_the_what_if_names_tiers_or_every_tier(client: TestClient) -> None:
    """`*` is every tier, and a tier named beside it wins over it; null is for ever."""
    every = forecast(client, billed_after_delete={"*": "0s"})
    hot_only = forecast(client, billed_after_delete={"hot": "0s"})
    assert every["billed_after_delete"] == {"hot": "0s", "versions": "0s", "cold": "0s"}
    assert every["series"] == hot_only["series"]  # only hot deletes anything here
    assert every["total_usd"] == hot_only["total_usd"]

    forever = forecast(client, billed_after_delete={"*": None, "cold": "0s"})
    assert forever["billed_after_delete"] == {"hot": None, "versions": None, "cold": "0s"}
    assert forever["series"][-1]["deleted_billed_bytes"] == (360 - 3) * 10**12


@pytest.mark.parametrize(
    ("what_if", "field"),
    [
        ({"moon": "7d"}, "billed_after_delete.moon"),
        ({"hot": "a week"}, "billed_after_delete.hot"),
        ({"hot": 7}, "billed_after_delete.hot"),
    ],
)
def test_a_bad_what_if_is_a_problem_naming_it(
    client: TestClient, what_if: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/forecast", json={**WORKED_EXAMPLE, "billed_after_delete": what_if})
    assert_problem(response, 422, field)


# --- plans ---------------------------------------------------------------------------------


def test_a_plan_says_when_the_saving_starts(
    client: TestClient, gcs_app: FastAPI, place: Place
) -> None:
    """Deletes go to the trash for CKPT_TRASH_RETENTION (7 days by default), and hot bills
    them 7 days more; a move frees hot's copy at once, billed 7 days; versions never stop
    billing. The monthly figure is the saving once it starts."""
    put_policy(client, ROLL)
    run = make_run(client, "proj", "run-1", policy="roll")
    old = place(run, 1, "rolling", "hot", 1000)
    stale = place(run, 2, "rolling", "versions", 500)
    milestone = place(run, 3, "milestone", "hot", 3000)
    place(run, 4, "rolling", "hot", 200)
    retention = gcs_app.state.settings.trash_retention

    before = datetime.now(UTC)
    response = client.post("/v1/plan", json={"run_id": run["id"]})
    after = datetime.now(UTC)

    assert response.status_code == 200, response.text
    actions = {a["checkpoint_id"]: a for a in response.json()["actions"]}
    assert set(actions) == {old["id"], stale["id"], milestone["id"]}

    def days(moment: datetime) -> set[str]:
        return {f"{moment:%Y-%m-%d}", f"{moment + (after - before):%Y-%m-%d}"}

    delete = actions[old["id"]]
    assert delete["reason"].startswith("roll: ")
    assert "hot keeps deleted bytes billed for 7d after the purge" in delete["reason"]
    assert f"after {retention.days}d in the trash" in delete["reason"]
    starts = delete["reason"].rsplit("the saving on hot starts ", 1)[1]
    assert starts in days(before + retention + SOFT_DELETE)
    assert delete["usd_month"] == pytest.approx(-usd(1000, "hot"), rel=1e-12)

    versions = actions[stale["id"]]["reason"]
    assert "the saving on versions never comes until someone removes them" in versions

    move = actions[milestone["id"]]
    assert move["kind"] == "move"
    moved = move["reason"].rsplit("the saving on hot starts ", 1)[1]
    assert "hot keeps deleted bytes billed for 7d after the move" in move["reason"]
    assert moved in days(before + SOFT_DELETE)
    assert move["usd_month"] == pytest.approx(usd(3000, "cold") - usd(3000, "hot"), rel=1e-12)


def test_a_plan_on_tiers_that_forget_says_nothing_more(
    client: TestClient, gcs_app: FastAPI, place: Place
) -> None:
    """A delete on cold (a local directory: deleted bytes are gone at once) keeps the
    engine's reason as it is."""
    put_policy(client, ROLL)
    run = make_run(client, "proj", "run-1", policy="roll")
    for step in (1, 2):
        response = register(
            client,
            run["id"],
            step,
            _local(gcs_app, run, step),
            "rolling",
            files=file_entries({"w": b"x" * 10}),
            created_at=iso(datetime.now(UTC) - timedelta(hours=1)),
        )
        assert response.status_code == 201, response.text

    response = client.post("/v1/plan", json={"run_id": run["id"]})

    assert response.status_code == 200, response.text
    [action] = response.json()["actions"]
    assert action["reason"] == "roll: delete, not kept by keep_last 1"


def _local(app: FastAPI, run: dict[str, Any], step: int) -> str:
    """A step written on cold, where the service itself would place it."""
    root = Path(app.state.settings.data_dir) / "cold" / run["project"] / run["name"]
    target = root / f"step-{step}"
    target.mkdir(parents=True, exist_ok=True)
    (target / "w").write_bytes(b"x" * 10)
    return f"file://{target.resolve()}"


def test_the_document_describes_the_new_shapes(client: TestClient) -> None:
    """Generated clients see the row kinds, the forecast's what-if and its figures."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    assert schemas["CostRowRead"]["properties"]["kind"]["enum"] == ["stored", "deleted_billed"]
    assert "billed_until" in schemas["CostRowRead"]["properties"]
    assert {"deleted_billed_bytes", "deleted_billed_usd_month"} <= set(
        schemas["CostReportRead"]["properties"]
    )
    assert "billed_after_delete" in schemas["ForecastRequest"]["properties"]
    assert {"deleted_billed_bytes", "deleted_billed_bytes_by_tier"} <= set(
        schemas["UsageRead"]["properties"]
    )
    assert "deleted_billed_usd" in schemas["ScenarioRead"]["properties"]
