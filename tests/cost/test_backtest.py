"""POST /v1/backtest over a catalog that lived 90 simulated days through the real API: three
runs (one resumed from another's milestone), restores, pins and a person's delete.

The policy in force, backtested, reproduces what was actually stored to the byte on every
day; a stricter candidate's regrets are exactly the checkpoints people came back for after
the day it would have deleted them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.builders import assert_problem, ledger, put_policy
from tests.conftest import empty
from tests.cost.history_driver import (
    DAY,
    START,
    STRICT,
    Catalog,
    Op,
    backtest,
    play,
    priced_app,
    series_bytes,
)

DAYS = 90
H = timedelta(hours=1)

IN_FORCE = """\
name: in-force
applies_to: {projects: [proj]}
rules:
  - name: rolling-keep-2
    class: rolling
    keep_last: 2
    action: delete
  - name: milestones-cold
    class: milestone
    when: {age: 10d}
    action: {move_to: cold}
  - name: milestones-thin
    class: milestone
    when: {run_ended: 7d}
    keep_last: 2
    action: delete
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
"""


def at(day: int, hour: int) -> timedelta:
    return day * DAY + hour * H


def run_ops(name: str, first: int, last: int, resumed_from: str | None = None) -> list[Op]:
    """A run from day `first` to `last`: a rolling checkpoint a day, a milestone every five
    days, a final one and its end."""
    ops = [Op(at(first, 1), "start", name, resumed_from=resumed_from)]
    for day in range(first, last + 1):
        ops.append(Op(at(day, 6), "save", name, 10 * day + 1, "rolling"))
        if day % 5 == 4:
            ops.append(Op(at(day, 12), "save", name, 10 * day + 5, "milestone"))
    ops.append(Op(at(last, 19), "save", name, 10 * last + 9, "final"))
    ops.append(Op(at(last, 20), "end", name))
    return ops


SCRIPT = [
    *run_ops("a", 0, 29),
    *run_ops("b", 20, 59, resumed_from="a/95"),
    *run_ops("c", 62, 84, resumed_from="a/145"),
    Op(at(16, 10), "restore", "a", 45),  # a still running: strict has deleted nothing yet
    Op(at(45, 10), "restore", "a", 245),  # on cold by now under the policy in force
    Op(at(50, 11), "delete", "b", 345),  # a person's delete: both worlds lose it
    Op(at(62, 9), "pin", "b", 395),  # b ended on day 59; in force thins it on day 66
    Op(at(70, 9), "pin", "b", 545),
]

# (checkpoint, use, when the strict policy would have deleted it, when it was used)
REGRETS = [
    ("a/245", "restored", at(29, 20), at(45, 10)),
    ("a/145", "resumed_from", at(29, 20), at(62, 1)),
    ("b/395", "pinned", at(59, 20), at(62, 9)),
    ("b/545", "pinned", at(59, 20), at(70, 9)),
]


# The stricter policy tried out in shadow beside the policy in force (it would govern the
# runs: a higher priority), and enforced on a copy of the catalog living the same days.
SHADOW = STRICT.replace("name: strict", "name: strict-shadow\nmode: shadow\npriority: 10")
ENFORCED_COPY = STRICT.replace("name: strict", "name: strict-enforced").replace(
    "projects: [proj]", "projects: [copy]"
)


@pytest.fixture(scope="module")
def worlds(
    database_url: str, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Catalog, Catalog]]:
    """The 90 days, lived once per database for every test of this module: by project
    `proj` under the policy in force (the stricter one in shadow beside it), and by
    project `copy` under the stricter policy enforced."""
    empty(engine)
    data_dir = tmp_path_factory.mktemp("lived") / "data"
    app = priced_app(database_url, engine, data_dir)
    with TestClient(app) as client:
        for policy in (IN_FORCE, SHADOW, ENFORCED_COPY):
            put_policy(client, policy)
        catalog = Catalog(app, client, data_dir)
        copy = Catalog(app, client, data_dir, project="copy")
        play([catalog, copy], SCRIPT, DAYS)
        yield catalog, copy


@pytest.fixture
def lived(worlds: tuple[Catalog, Catalog]) -> Catalog:
    return worlds[0]


def test_over_the_same_days_the_shadow_ledger_is_the_ledger_of_the_policy_enforced(
    worlds: tuple[Catalog, Catalog],
) -> None:
    lived, copy = worlds
    answer = lived.client.get("/v1/policies/strict-shadow/shadow")
    assert answer.status_code == 200, answer.text
    names = {v: k for k, v in lived.ids.items()}
    shadow = sorted(
        (names[a["checkpoint_id"]], a["kind"], a["to_tier"], a["rule"].split("/")[1],
         _offset(a["created_at"]))
        for a in answer.json()["actions"]
    )  # fmt: skip
    copy_names = {v: k for k, v in copy.ids.items()}
    enforced = sorted(
        (copy_names[a["checkpoint_id"]], a["kind"], a["to_tier"], a["rule"].split("/")[1],
         _offset(a["created_at"]))
        for run in copy.runs.values()
        for a in ledger(copy.client, run_id=run["id"])
        if a["rule"].startswith("strict-enforced/") and a["kind"] != "purge"  # its delete's
    )  # fmt: skip
    assert len(enforced) > 100 and {a[1] for a in enforced} == {"delete"}
    assert shadow == enforced
    # nothing of the shadow's was carried out: its deletes of milestones the policy in
    # force keeps left them in the catalog
    kept = lived.client.get(f"/v1/checkpoints/{lived.ids['b/545']}").json()
    assert kept["state"] == "active" and kept["pinned"] is True


def test_the_policy_in_force_backtested_reproduces_what_was_stored_to_the_byte(
    lived: Catalog,
) -> None:
    result = backtest(lived.client, "in-force", DAYS)
    assert len(result["series"]) == DAYS
    assert result["series"][0]["day"] == START.date().isoformat()
    candidate, actual = series_bytes(result["series"]), series_bytes(result["actual"]["series"])
    assert candidate == actual == lived.days  # what the catalog itself reported each night
    assert {"cold", "archive"} <= {t for day in actual for t in day}  # it moved and copied
    assert result["total_usd"] == pytest.approx(result["actual"]["total_usd"], rel=1e-6)
    assert result["total_usd"] > 0
    assert abs(result["savings_usd"]) < 1e-6 * result["total_usd"]
    assert result["runs"] == 3


def test_a_stricter_policy_saves_and_regrets_exactly_what_people_came_back_for(
    lived: Catalog,
) -> None:
    result = backtest(lived.client, yaml.safe_load(STRICT), DAYS)
    assert result["savings_usd"] > 0
    assert all(
        sum(c.values()) <= sum(a.values())
        for c, a in zip(
            series_bytes(result["series"]), series_bytes(result["actual"]["series"]), strict=True
        )
    )
    names = {v: k for k, v in lived.ids.items()}
    found = [
        (
            names[r["checkpoint_id"]],
            r["use"],
            _offset(r["would_delete_at"]),
            _offset(r["used_at"]),
        )
        for r in result["regrets"]
    ]
    assert found == REGRETS
    assert all(r["action"] == "delete" for r in result["regrets"])


def test_a_window_reports_only_its_days(lived: Catalog) -> None:
    since = (START + 30 * DAY).isoformat()
    until = (START + 40 * DAY).isoformat()
    result = backtest(lived.client, "in-force", DAYS, since=since, until=until)
    assert [d["day"] for d in result["series"]] == [
        (START + d * DAY).date().isoformat() for d in range(30, 40)
    ]
    assert series_bytes(result["series"]) == lived.days[30:40]
    assert series_bytes(result["actual"]["series"]) == lived.days[30:40]


def test_one_run_alone(lived: Catalog) -> None:
    run = lived.runs["c"]["id"]
    result = backtest(lived.client, "in-force", DAYS, run_id=run)
    assert result["runs"] == 1
    assert series_bytes(result["series"]) == series_bytes(result["actual"]["series"])
    assert result["series"][0]["day"] == (START + 62 * DAY).date().isoformat()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"policy": "no-such-policy"}, "policy"),
        ({"policy": {"name": "x", "rules": [{"name": "r", "keep_last": -3}]}}, "policy"),
        ({"policy": "in-force", "since": "yesterday"}, "since"),
        ({"policy": "in-force", "project": "nobody"}, "project"),
        ({"policy": "in-force", "run_id": "no-such-run"}, "run_id"),
        ({"policy": "in-force", "surprise": 1}, "surprise"),
    ],
)
def test_bad_input_names_the_field(lived: Catalog, body: dict[str, Any], field: str) -> None:
    answer = lived.client.post("/v1/backtest", json=body)
    assert 400 <= answer.status_code < 500
    assert_problem(answer, answer.status_code, field)


def test_a_window_with_no_day_in_it_is_an_empty_series(lived: Catalog) -> None:
    body = {
        "policy": "in-force",
        "since": (START + 50 * DAY).isoformat(),
        "until": (START + 40 * DAY).isoformat(),
    }
    answer = lived.client.post("/v1/backtest", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["series"] == result["actual"]["series"] == [] and result["regrets"] == []
    assert result["total_usd"] == result["actual"]["total_usd"] == 0


def test_a_window_from_before_the_first_event_starts_with_it(lived: Catalog) -> None:
    result = backtest(lived.client, "in-force", DAYS, since="2001-01-01T00:00:00Z")
    assert result["series"][0]["day"] == START.date().isoformat()
    assert len(result["series"]) == DAYS


def _offset(text: str) -> timedelta:
    """An instant as its offset from START, to the minute (the clock ticks meanwhile)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return timedelta(minutes=int((moment - START).total_seconds() // 60))
