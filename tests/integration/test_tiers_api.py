"""Tiers over HTTP: the default four in rank order with their usage, a tiers file with
nested urls (longest prefix wins), and liveness."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import assert_problem, make_checkpoint, make_run, register, write_checkpoint


def usage(client: TestClient) -> dict[str, tuple[int, int]]:
    response = client.get("/v1/tiers")
    assert response.status_code == 200, response.text
    return {
        t["name"]: (t["usage"]["bytes"], t["usage"]["checkpoints"])
        for t in response.json()["items"]
    }


def test_default_tiers_in_rank_order(client: TestClient, data_dir: Path) -> None:
    response = client.get("/v1/tiers")

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["next_cursor"] is None
    names = ["hot", "warm", "cold", "archive"]
    assert [t["name"] for t in body["items"]] == names
    assert [t["rank"] for t in body["items"]] == [0, 1, 2, 3]
    for tier in body["items"]:
        assert tier["url"] == f"file://{(data_dir / tier['name']).resolve()}"
        assert tier["usage"] == {"bytes": 0, "checkpoints": 0}
        assert tier["storage_class"] is None
        price = tier["price"]
        assert {"storage_gb_month", "retrieval_gb", "egress_gb", "min_storage_days"} <= set(price)
        # a local tier costs nothing unless the operator prices it
        assert price["storage_gb_month"] == 0 and price["min_storage_days"] == 0
        assert price["provider"] == "local" and price["catalog"] is None and price["given"] == []
        assert (data_dir / tier["name"]).is_dir()  # local tier directories exist at start


def test_usage_counts_committed_checkpoints_per_tier(client: TestClient, data_dir: Path) -> None:
    a = make_run(client, "proj", "a")
    b = make_run(client, "other", "b")
    hot1 = write_checkpoint(data_dir / "hot", "proj/a/step-1", {"w": b"x" * 100})
    hot2 = write_checkpoint(data_dir / "hot", "other/b/step-1", {"w": b"x" * 23, "o": b"y" * 7})
    cold = write_checkpoint(data_dir / "cold", "proj/a/step-2", {"w": b"z" * 1000})
    make_checkpoint(client, a["id"], 1, hot1)
    make_checkpoint(client, b["id"], 1, hot2)
    make_checkpoint(client, a["id"], 2, cold, "final")
    warm = (data_dir / "warm" / "proj/a/step-3").resolve()
    reserved = make_checkpoint(
        client, a["id"], 3, f"file://{warm}", committed=False, size_bytes=5000
    )

    assert usage(client) == {
        "hot": (130, 2),
        "warm": (0, 0),  # a step still being written is not stored yet
        "cold": (1000, 1),
        "archive": (0, 0),
    }

    write_checkpoint(data_dir / "warm", "proj/a/step-3", {"w": b"q" * 5000})
    committed = client.post(f"/v1/checkpoints/{reserved['id']}/commit", json={})
    assert committed.status_code == 200, committed.text
    assert usage(client)["warm"] == (5000, 1)


def test_refused_registrations_do_not_count(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-1", {"w": b"x" * 10})
    make_checkpoint(client, run["id"], 1, uri)

    assert register(client, run["id"], 1, uri).status_code == 200  # the same again
    assert_problem(register(client, run["id"], 1, uri, "final"), 409, "step")
    assert_problem(register(client, run["id"], 2, uri), 409, "uri")  # step 1's place
    other = write_checkpoint(data_dir / "hot", "proj/run-1/step-2", {"w": b"x" * 10})
    assert_problem(register(client, run["id"], 2, other, size_bytes=11), 422, "size_bytes")

    assert usage(client)["hot"] == (10, 1)


@pytest.fixture
def tiers_client(
    tmp_path: Path, database_url: str, clean_engine: Engine
) -> Iterator[tuple[TestClient, Path]]:
    """An app whose tiers come from a file: `outer` holds `inner` (listed later, so only the
    longest prefix, not the first match, can pick it) and an object-store tier."""
    root = (tmp_path / "store").resolve()
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(
        f"""
tiers:
  - name: outer
    url: file://{root}
  - name: inner
    url: file://{root}/fast/
    price: {{storage_gb_month: 0.08}}
  - name: glacier
    url: s3://ckpt-cold/prod
    storage_class: GLACIER_IR
    price: {{storage_gb_month: 0.004, retrieval_gb: 0.03, egress_gb: 0.09, min_storage_days: 90}}
"""
    )
    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path / "unused",
        tiers_file=tiers_file,
        policies_dir=tmp_path / "no-policies",  # the shipped ones name the default tiers
        auth="off",
    )
    with TestClient(create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)) as client:
        yield client, root


def test_a_tiers_file_lists_its_tiers_in_file_order(
    tiers_client: tuple[TestClient, Path],
) -> None:
    client, root = tiers_client

    items: list[dict[str, Any]] = client.get("/v1/tiers").json()["items"]

    assert [(t["name"], t["rank"]) for t in items] == [("outer", 0), ("inner", 1), ("glacier", 2)]
    assert items[0]["url"] == f"file://{root}"
    assert items[1]["url"] == f"file://{root}/fast"
    assert items[1]["price"]["storage_gb_month"] == 0.08
    assert items[2]["url"] == "s3://ckpt-cold/prod"
    assert items[2]["storage_class"] == "GLACIER_IR"
    glacier = items[2]["price"]
    assert {k: glacier[k] for k in ("storage_gb_month", "retrieval_gb", "egress_gb")} == {
        "storage_gb_month": 0.004,
        "retrieval_gb": 0.03,
        "egress_gb": 0.09,
    }
    assert glacier["min_storage_days"] == 90
    # the figures the tiers file leaves out come from the catalog entry, with their source
    assert glacier["catalog"] == "aws/GLACIER_IR"
    assert glacier["min_object_bytes"] == 128 * 1024
    assert glacier["sources"]["min_object_bytes"]["url"].startswith("https://aws.amazon.com/")
    assert "storage_gb_month" not in glacier["sources"]  # the operator's own figure


def test_the_longest_tier_prefix_wins(tiers_client: tuple[TestClient, Path]) -> None:
    client, root = tiers_client
    run = make_run(client)
    in_inner = write_checkpoint(root / "fast", "proj/run-1/step-1", {"w": b"1"})
    in_outer = write_checkpoint(root, "proj/run-1/step-2", {"w": b"22"})
    lookalike = write_checkpoint(root / "fastlane", "proj/run-1/step-3", {"w": b"333"})

    placed = {
        step: make_checkpoint(client, run["id"], step, uri)
        for step, uri in ((1, in_inner), (2, in_outer), (3, lookalike))
    }

    assert {step: c["tier"] for step, c in placed.items()} == {1: "inner", 2: "outer", 3: "outer"}
    assert placed[1]["locations"][0]["uri"] == in_inner
    assert usage(client) == {"outer": (5, 2), "inner": (1, 1), "glacier": (0, 0)}


def test_an_object_store_tier_takes_a_manifest(tiers_client: tuple[TestClient, Path]) -> None:
    client, _ = tiers_client
    run = make_run(client)
    uri = "s3://ckpt-cold/prod/proj/run-1/step-100"
    files = [{"path": "model.safetensors", "size_bytes": 4096}]

    created = make_checkpoint(client, run["id"], 100, uri + "/", "final", files=files)

    assert created["tier"] == "glacier"
    assert created["uri"] == uri
    assert created["locations"] == [
        {"tier": "glacier", "uri": uri, "storage_class": "GLACIER_IR", "role": "primary"}
    ]
    assert usage(client)["glacier"] == (4096, 1)
    assert_problem(register(client, run["id"], 102, "s3://ckpt-cold/other/x", files=files), 422)
    assert_problem(register(client, run["id"], 103, "s3://ckpt-cold/prodx/y", files=files), 422)
    assert [c["step"] for c in client.get(f"/v1/runs/{run['id']}/checkpoints").json()["items"]] == [
        100
    ]


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_tiers_list_pages_like_every_list(client: TestClient) -> None:
    first = client.get("/v1/tiers", params={"limit": 3})
    assert first.status_code == 200
    assert [t["name"] for t in first.json()["items"]] == ["hot", "warm", "cold"]
    cursor = first.json()["next_cursor"]
    assert cursor is not None
    rest = client.get("/v1/tiers", params={"limit": 3, "cursor": cursor}).json()
    assert [t["name"] for t in rest["items"]] == ["archive"]
    assert rest["next_cursor"] is None
