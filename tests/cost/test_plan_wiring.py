"""The plan and the sweep skip a demotion the policy would undo before the new tier's
minimum duration, when the unserved days cost more than the move saves (section 7b); the
dry run prices every planned action (early deletion, retrieval, egress)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.services.lifecycle.planning import plan_catalog
from app.settings import Settings
from tests.builders import ago, end_run, ledger, make_run, place_checkpoint, put_policy
from tests.cost.conftest import cost_app
from tests.cost.helpers import SHIPPED_POLICY

SHORT_STAY = """\
name: short-stay
rules:
  - {name: cool, class: milestone, when: {run_ended: 1d}, action: {move_to: cold}}
  - {name: purge, class: milestone, when: {run_ended: 11d}, action: delete}
"""


@pytest.fixture
def client(
    settings: Settings, clean_engine: Engine, data_dir: Path, tmp_path: Path
) -> Iterator[TestClient]:
    """hot at $0.023 per GB-month; cold at $0.004 with a 90-day minimum (Glacier IR)."""
    tiers_file = tmp_path / "tiers.yaml"
    prices = {
        "hot": "{storage_gb_month: 0.023}",
        "warm": "{storage_gb_month: 0.0125}",
        "cold": "{storage_gb_month: 0.004, min_storage_days: 90}",
        "archive": "{storage_gb_month: 0.00099}",
    }
    tiers_file.write_text(
        "tiers:\n"
        + "".join(
            f"  - {{name: {name}, url: 'file://{(data_dir / name).resolve()}', price: {price}}}\n"
            for name, price in prices.items()
        )
    )
    settings.policies_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED_POLICY, settings.policies_dir / "default.yaml")
    app = cost_app(settings.model_copy(update={"tiers_file": tiers_file}), clean_engine)
    with TestClient(app) as test_client:
        yield test_client


def milestone_of_a_run_ended_2_days_ago(client: TestClient, data_dir: Path) -> dict[str, Any]:
    put_policy(client, SHORT_STAY)
    run = make_run(client, "proj", "run-1", policy="short-stay")
    checkpoint = place_checkpoint(
        client, data_dir, run, 100, "milestone", files={"w": b"x" * 10**6}, created_at=ago(days=9)
    )
    end_run(client, run["id"], ago(days=2))
    return checkpoint


def test_the_plan_lists_the_skipped_demotion_with_its_reason(
    client: TestClient, data_dir: Path
) -> None:
    checkpoint = milestone_of_a_run_ended_2_days_ago(client, data_dir)

    response = client.post("/v1/plan", json={"project": "proj"})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["actions"] == []
    (skipped,) = body["skipped"]
    assert skipped["checkpoint_id"] == checkpoint["id"]
    assert skipped["rule"] == "short-stay/cool"
    assert skipped["reason"].startswith(
        "early deletion: purge would remove it from cold 9 days after the move, before its "
        "90-day minimum; the unserved 81 days cost"
    )


def test_the_sweep_does_not_move_it_and_the_purge_still_comes(
    client: TestClient, data_dir: Path
) -> None:
    checkpoint = milestone_of_a_run_ended_2_days_ago(client, data_dir)

    assert client.post("/v1/sweeps", json={}).status_code == 202
    assert ledger(client, checkpoint_id=checkpoint["id"]) == []

    end_run(
        client, client.get(f"/v1/checkpoints/{checkpoint['id']}").json()["run_id"], ago(days=12)
    )
    assert client.post("/v1/sweeps", json={}).status_code == 202
    kinds = [a["kind"] for a in ledger(client, checkpoint_id=checkpoint["id"])]
    assert kinds == ["delete"]


def test_a_longer_stay_is_worth_the_move(client: TestClient, data_dir: Path) -> None:
    put_policy(client, SHORT_STAY.replace("run_ended: 11d", "run_ended: 31d"))
    run = make_run(client, "proj", "run-1", policy="short-stay")
    place_checkpoint(client, data_dir, run, 100, "milestone", created_at=ago(days=9))
    end_run(client, run["id"], ago(days=2))

    body = client.post("/v1/plan", json={"project": "proj"}).json()

    assert [(a["kind"], a["to_tier"]) for a in body["actions"]] == [("move", "cold")]
    assert body["skipped"] == []


def test_the_dry_run_prices_an_early_delete(client: TestClient, data_dir: Path) -> None:
    """A delete from cold (90-day minimum, $0.004 per GB-month) 9 days after the checkpoint
    was written there pays the unserved 81 days: 10^6 bytes / 10^9 x 0.004 x 81 / 30."""
    put_policy(
        client,
        "name: drop\nrules:\n"
        "  - {name: drop, class: milestone, when: {run_ended: 1d}, action: delete}\n",
    )
    run = make_run(client, "proj", "run-1", policy="drop")
    place_checkpoint(
        client,
        data_dir,
        run,
        100,
        "milestone",
        tier="cold",
        files={"w": b"x" * 10**6},
        created_at=ago(days=9),
    )
    end_run(client, run["id"], ago(days=2))
    app: Any = client.app

    with app.state.session_factory() as session:
        plan = plan_catalog(session, tiers=app.state.tiers, now=datetime.now(UTC), project="proj")

    (item,) = plan.items
    assert (item.action.kind, item.action.from_tier) == ("delete", "cold")
    assert item.cost is not None
    assert item.cost.early_deletion_usd == pytest.approx(10**6 / 10**9 * 0.004 * 81 / 30, rel=1e-4)
    assert item.cost.retrieval_usd == item.cost.egress_usd == 0.0
    assert plan.fees_usd() == pytest.approx(item.cost.total_usd)
