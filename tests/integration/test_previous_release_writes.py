"""A plan reads a checkpoint's tier from its row; the previous release does not write it.

During a rollout the previous release's API and workers run beside this one's (and again
after a rollback): they insert checkpoints without a tier on the row, and move or remove
primary locations without touching it. A plan must still see where each checkpoint is:
a rule scoped `on_tier` would otherwise delete a checkpoint that has left that tier. The
statements below are the ones the previous release sends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text

from app.db.models import Checkpoint
from tests.builders import make_run, place_checkpoint
from tests.conftest import empty, tiers_out_of_step

# What-if: delete every milestone still on hot (a scratch tier's TTL, say).
HOT_TTL = {
    "name": "hot-ttl",
    "rules": [
        {"name": "hot-ttl", "class": "milestone", "when": {"on_tier": ["hot"]}, "action": "delete"}
    ],
}


def planned_deletes(client: TestClient) -> set[str]:
    response = client.post("/v1/plan", json={"policy": HOT_TTL})
    assert response.status_code == 200, response.text
    return {a["checkpoint_id"] for a in response.json()["actions"] if a["kind"] == "delete"}


def row_tier(engine: Engine, checkpoint_id: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(Checkpoint.tier).where(Checkpoint.id == checkpoint_id)).scalar()


def test_a_primary_the_previous_release_moves_or_removes_takes_the_rows_tier_along(
    client: TestClient, clean_engine: Engine, data_dir: Path
) -> None:
    run = make_run(client)
    moved = place_checkpoint(client, data_dir, run, 1, "milestone")
    purged = place_checkpoint(client, data_dir, run, 2, "milestone")
    stays = place_checkpoint(client, data_dir, run, 3, "milestone")
    place_checkpoint(client, data_dir, run, 4)  # the run's newest is never deleted
    assert planned_deletes(client) == {moved["id"], purged["id"], stays["id"]}
    cold_uri = f"file://{data_dir}/cold/moved"
    with clean_engine.begin() as conn:  # its worker's switch, then its purge
        conn.execute(
            text(
                "UPDATE locations SET tier = 'cold', uri = :uri, storage_class = NULL "
                "WHERE checkpoint_id = :id AND role = 'primary'"
            ),
            {"uri": cold_uri, "id": moved["id"]},
        )
        conn.execute(
            text("UPDATE checkpoints SET uri = :uri WHERE id = :id"),
            {"uri": cold_uri, "id": moved["id"]},
        )
        conn.execute(text("DELETE FROM locations WHERE checkpoint_id = :id"), {"id": purged["id"]})
        conn.execute(
            text("UPDATE checkpoints SET state = 'deleted' WHERE id = :id"), {"id": purged["id"]}
        )
    assert row_tier(clean_engine, moved["id"]) == "cold"
    assert row_tier(clean_engine, purged["id"]) is None
    assert row_tier(clean_engine, stays["id"]) == "hot"
    assert planned_deletes(client) == {stays["id"]}  # not the one now on cold


def test_a_checkpoint_the_previous_release_inserts_is_planned_from_its_primary(
    client: TestClient, clean_engine: Engine, data_dir: Path
) -> None:
    run = make_run(client)
    made = datetime.now(UTC) - timedelta(days=3)
    rows: dict[str, Any] = {}
    with clean_engine.begin() as conn:  # its registration: no tier on the row
        for step, tier in ((1, "hot"), (2, "cold")):
            cid, uri = f"ckpt_previous_{step}", f"file://{data_dir}/{tier}/previous-{step}"
            conn.execute(
                text(
                    "INSERT INTO checkpoints (id, run_id, step, class, state, uri, size_bytes, "
                    "metrics, labels, pinned, single_file, health, created_at, registered_at, "
                    "committed_at) VALUES (:id, :run, :step, 'milestone', 'active', :uri, 10, "
                    "'{}', '{}', false, false, 'ok', :made, :made, :made)"
                ),
                {"id": cid, "run": run["id"], "step": step, "uri": uri, "made": made},
            )
            conn.execute(
                text(
                    "INSERT INTO locations (checkpoint_id, tier, uri, role) "
                    "VALUES (:id, :tier, :uri, 'primary')"
                ),
                {"id": cid, "tier": tier, "uri": uri},
            )
            rows[tier] = cid
    assert tiers_out_of_step(clean_engine) == [
        (rows["hot"], None, "hot"),
        (rows["cold"], None, "cold"),
    ]
    assert planned_deletes(client) == {rows["hot"]}
    empty(clean_engine)  # rows this release would not write, gone before the check at the end
