"""A catalog's history, lived through the real API on a moved clock: runs start and end,
checkpoints land, people pin, restore and delete, and after each event the event's run is
evaluated and its actions executed, as the service would; at each midnight every run is.

One script can be played into several catalogs (each with its own policy), so a test can
compare what a backtest says a policy would have done with what it does when enforced.
A script names checkpoints by its own names; each catalog has its own ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import time_machine
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import end_run, iso, ledger, make_executor, place_checkpoint, with_tiers

START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
DAY = timedelta(days=1)
SIZE = {"rolling": 3000, "milestone": 5000, "final": 7000}

TIERS: list[dict[str, Any]] = [
    {"name": "hot", "price": {"storage_gb_month": 23.0}},
    {"name": "cold", "price": {"storage_gb_month": 4.0}},
    {"name": "archive", "price": {"storage_gb_month": 1.0}},
]


# A policy stricter than the ones the tests live their history under: one rolling
# checkpoint, and one milestone once the run ends.
STRICT = """\
name: strict
applies_to: {projects: [proj]}
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
  - name: milestones-gone
    class: milestone
    when: {run_ended: 0s}
    keep_last: 1
    action: delete
"""


def tiers_file(data_dir: Path) -> list[dict[str, Any]]:
    return [{**t, "url": f"file://{(data_dir / t['name']).resolve()}"} for t in TIERS]


def priced_app(database_url: str, engine: Engine, data_dir: Path) -> FastAPI:
    """An app on `engine` with the priced local tiers under `data_dir`, a trash that purges
    at once, and no background thread (the driver evaluates and executes)."""
    settings = Settings(
        database_url=database_url,
        data_dir=data_dir,
        policies_dir=data_dir.parent / "policies",
        auth="off",
        trash_retention=timedelta(0),
    )
    return create_app(
        with_tiers(settings, tiers_file(data_dir)), engine=engine, roles=NO_BACKGROUND
    )


@dataclass(frozen=True)
class Op:
    """At `at` (an offset from START): `start` run, `save` (run, step, class), `end` run,
    `pin`, `restore` (onto hot) or `delete` a checkpoint named `run/step`."""

    at: timedelta
    kind: str
    run: str
    step: int = 0
    klass: str = "rolling"
    resumed_from: str | None = None  # `start`: the checkpoint `run/step` it resumes from


@dataclass
class Catalog:
    """One catalog the script is played into."""

    app: FastAPI
    client: TestClient | httpx.Client
    data_dir: Path
    project: str = "proj"
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # `run/step` -> checkpoint id
    days: list[dict[str, int]] = field(default_factory=list)  # bytes by tier, each day's end


def play(catalogs: Sequence[Catalog], script: Sequence[Op], days: int) -> None:
    """Live `days` days of `script` in every catalog, the clock moving for all of them."""
    ops = sorted(script, key=lambda op: op.at)
    with time_machine.travel(START, tick=True) as clock:
        for day in range(days):
            midnight = START + day * DAY
            clock.move_to(midnight)
            for catalog in catalogs:
                _settle(catalog, None)
            for op in (o for o in ops if midnight <= START + o.at < midnight + DAY):
                clock.move_to(START + op.at)
                for catalog in catalogs:
                    _apply(catalog, op)
            clock.move_to(midnight + DAY - timedelta(seconds=1))
            for catalog in catalogs:
                catalog.days.append(_stored(catalog.client, catalog.project))


def _apply(catalog: Catalog, op: Op) -> None:
    client = catalog.client
    # The op's own moment, not the ticking clock's: catalogs played one after the other
    # would otherwise send times later by however long the ones before took, and a
    # threshold of exactly a day between two saves would hold or not by that delay.
    now = START + op.at
    if op.kind == "start":
        body: dict[str, Any] = {"project": catalog.project, "name": op.run, "started_at": iso(now)}
        if op.resumed_from is not None:
            body["resumed_from"] = catalog.ids[op.resumed_from]
        answer = client.post("/v1/runs", json=body)
        assert answer.status_code == 201, answer.text
        catalog.runs[op.run] = answer.json()
        return
    run = catalog.runs[op.run]
    name = f"{op.run}/{op.step}"
    if op.kind == "save":
        files = {"weights.bin": b"w" * SIZE[op.klass]}
        made = place_checkpoint(
            client, catalog.data_dir, run, op.step, op.klass, files=files, created_at=now
        )
        catalog.ids[name] = made["id"]
    elif op.kind == "end":
        end_run(client, run["id"], now)
    elif op.kind == "pin":
        answer = client.post(f"/v1/checkpoints/{catalog.ids[name]}/pin", json={"reason": "x"})
        assert answer.status_code in (200, 409), answer.text  # 409: gone in this catalog
    elif op.kind == "restore":
        answer = client.post(f"/v1/checkpoints/{catalog.ids[name]}/restore", json={"tier": "hot"})
        assert answer.status_code in (200, 202, 409), answer.text  # 409: gone, or on hot
    elif op.kind == "delete":
        answer = client.delete(f"/v1/checkpoints/{catalog.ids[name]}")
        assert answer.status_code in (202, 409), answer.text
    _settle(catalog, run["id"])


def _settle(catalog: Catalog, run_id: str | None) -> None:
    """Evaluate one run (or every run of the catalog's project), approve what the blast
    radius held (a backtest counts held deletes as approved) and execute every action,
    purges included."""
    client = catalog.client
    if not catalog.runs:
        return
    scope = {"run_id": run_id} if run_id else {"project": catalog.project}
    sweep = client.post("/v1/sweeps", json=scope)
    assert sweep.status_code == 202, sweep.text
    for held in ledger(client, state="held"):
        approved = client.post(f"/v1/actions/{held['id']}/approve")
        assert approved.status_code == 200, approved.text
    make_executor(catalog.app, trash_retention=timedelta(0)).drain()


def _stored(client: TestClient | httpx.Client, project: str) -> dict[str, int]:
    if not client.get("/v1/runs", params={"project": project}).json()["items"]:
        return {}
    answer = client.get("/v1/reports/cost", params={"group_by": "tier", "project": project})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    return {row["key"]: row["bytes"] for row in rows if row["kind"] == "stored" and row["bytes"]}


def backtest(
    client: TestClient | httpx.Client, policy: str | dict[str, Any], days: int, **body: Any
) -> dict[str, Any]:
    """POST /v1/backtest on the day after the script's last."""
    with time_machine.travel(START + days * DAY, tick=False):
        answer = client.post("/v1/backtest", json={"policy": policy, **body})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def series_bytes(series: list[dict[str, Any]]) -> list[dict[str, int]]:
    return [{t: b for t, b in day["bytes_by_tier"].items() if b} for day in series]
