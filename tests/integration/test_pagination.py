"""Paginated lists: every item exactly once and in order, the last page says so, and a
cursor stays valid while new items arrive between pages."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import list_all, make_checkpoint, make_run

RUNS = "/v1/runs"


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for item in items]


def one_page(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def make_runs(client: TestClient, names: list[str], project: str = "proj") -> list[dict[str, Any]]:
    """Runs created one after another, each in its own millisecond: run ids are time-ordered
    at that grain, so the creation order is the order a newest-first list must show."""
    runs = []
    for name in names:
        runs.append(make_run(client, project, name))
        tick = time.time_ns() // 1_000_000
        while time.time_ns() // 1_000_000 <= tick:
            pass
    return runs


def reserve(client: TestClient, data_dir: Path, run: dict[str, Any], step: int) -> None:
    """A `writing` checkpoint: a real row, no bytes needed yet."""
    target = (data_dir / "hot" / "proj" / run["name"] / f"step-{step}").resolve()
    make_checkpoint(client, run["id"], step, f"file://{target}", committed=False)


def test_runs_pages_hold_every_run_once_in_order(
    client: TestClient, subtests: pytest.Subtests
) -> None:
    created = make_runs(client, [f"run-{i:02d}" for i in range(11)])
    newest_first = ids(created)[::-1]
    everything = one_page(client, RUNS, limit=1000)
    assert everything["next_cursor"] is None
    assert ids(everything["items"]) == newest_first

    for limit in (1, 3, 4, 10, 11, 12):
        with subtests.test(limit=limit):
            items, pages = list_all(client, RUNS, limit)
            assert ids(items) == newest_first
            assert pages == -(-11 // limit)


def test_runs_pages_respect_filters(client: TestClient) -> None:
    wanted = []
    for i in range(9):
        run = make_run(client, "alpha" if i % 3 else "beta", f"run-{i}")
        if i % 2:
            client.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
        elif run["project"] == "alpha":
            wanted.append(run["id"])

    items, pages = list_all(client, RUNS, 2, project="alpha", status="active")

    assert sorted(ids(items)) == sorted(wanted)
    assert all((r["project"], r["status"]) == ("alpha", "active") for r in items)
    assert pages == 2


def test_an_exactly_full_last_page_has_no_cursor(client: TestClient) -> None:
    for i in range(6):
        make_run(client, "proj", f"run-{i}")

    first = one_page(client, RUNS, limit=3)
    second = one_page(client, RUNS, limit=3, cursor=first["next_cursor"])

    assert first["next_cursor"] is not None
    assert len(second["items"]) == 3
    assert second["next_cursor"] is None


def test_an_empty_list_is_one_page(client: TestClient) -> None:
    assert one_page(client, RUNS, limit=5) == {"items": [], "next_cursor": None}


def test_runs_cursor_survives_new_runs_between_pages(client: TestClient) -> None:
    originals = make_runs(client, [f"run-{i}" for i in range(7)])

    first = one_page(client, RUNS, limit=3)
    newcomers = make_runs(client, [f"new-{i}" for i in range(3)])
    second = one_page(client, RUNS, limit=3, cursor=first["next_cursor"])
    newcomers += make_runs(client, ["newest"], project="other")
    third = one_page(client, RUNS, limit=3, cursor=second["next_cursor"])

    seen = ids(first["items"]) + ids(second["items"]) + ids(third["items"])
    # every original once, in order; runs newer than the cursor start a fresh first page
    assert seen == ids(originals)[::-1]
    assert third["next_cursor"] is None
    assert set(ids(newcomers)).isdisjoint(seen)
    assert ids(one_page(client, RUNS, limit=4)["items"]) == ids(newcomers)[::-1]


def test_checkpoint_pages_hold_every_step_once_newest_first(
    client: TestClient, data_dir: Path, subtests: pytest.Subtests
) -> None:
    run = make_run(client)
    all_steps = [i * 500 for i in range(1, 26)]  # 500 ... 12500: text order would differ
    for step in random.Random(7).sample(all_steps, len(all_steps)):
        reserve(client, data_dir, run, step)

    for limit in (1, 4, 10, 24, 25, 26):
        with subtests.test(limit=limit):
            items, pages = list_all(client, f"/v1/runs/{run['id']}/checkpoints", limit)
            assert [c["step"] for c in items] == sorted(all_steps, reverse=True)
            assert len(set(ids(items))) == 25
            assert pages == -(-25 // limit)


def test_checkpoint_pages_respect_filters(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    for step in range(1, 16):
        target = (data_dir / "hot" / f"proj/run-1/step-{step}").resolve()
        klass = "milestone" if step % 3 == 0 else "rolling"
        make_checkpoint(client, run["id"], step, f"file://{target}", klass, committed=False)

    items, pages = list_all(
        client, f"/v1/runs/{run['id']}/checkpoints", 2, **{"class": "milestone"}
    )

    assert [c["step"] for c in items] == [15, 12, 9, 6, 3]
    assert pages == 3


def test_checkpoint_cursor_survives_new_steps_between_pages(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    for step in (100, 200, 300, 400, 500, 600):
        reserve(client, data_dir, run, step)
    path = f"/v1/runs/{run['id']}/checkpoints"

    first = one_page(client, path, limit=2)
    reserve(client, data_dir, run, 50)  # older than the cursor: still ahead of the reader
    reserve(client, data_dir, run, 450)  # between pages already read and pages to come
    reserve(client, data_dir, run, 9000)  # newer than the cursor: belongs to a fresh read
    rest, _ = list_all(client, path, 2, cursor=first["next_cursor"])

    seen = [c["step"] for c in first["items"] + rest]
    assert seen == [600, 500, 450, 400, 300, 200, 100, 50]
    assert len(set(seen)) == len(seen)


def test_checkpoint_cursor_belongs_to_its_run(client: TestClient, data_dir: Path) -> None:
    a = make_run(client, "proj", "a")
    b = make_run(client, "proj", "b")
    for step in (10, 20, 30):
        reserve(client, data_dir, a, step)
        reserve(client, data_dir, b, step + 1)

    cursor = one_page(client, f"/v1/runs/{a['id']}/checkpoints", limit=1)["next_cursor"]
    rest = one_page(client, f"/v1/runs/{b['id']}/checkpoints", cursor=cursor)

    # a cursor only remembers a step; on another run it never leaks run a's checkpoints
    assert [c["run_id"] for c in rest["items"]] == [b["id"], b["id"]]
    assert [c["step"] for c in rest["items"]] == [21, 11]
