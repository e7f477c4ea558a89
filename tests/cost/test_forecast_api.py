"""POST /v1/forecast and POST /v1/planner over HTTP: the worked example of section 1 with the
stored default policy, what-if prices, and bad input answered as problems naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.cost.prices import catalog
from tests.builders import assert_problem

TB = 10**12
EXAMPLE: dict[str, Any] = {
    "checkpoint_bytes": 1e12,
    "run_days": 45,
    "schedule": {"rolling": "3h", "milestone": "1d", "final": "end"},
    "policy": "default",
    "concurrent_runs": 1,
    "horizon_days": 75,
}
FLAT = {name: {"storage_gb_month": 0.023} for name in ("hot", "warm", "cold", "archive")}


def forecast(client: TestClient, **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/forecast", json={**EXAMPLE, **changes})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_worked_example(cost_client: TestClient) -> None:
    body = forecast(cost_client, prices=FLAT)

    assert body["at_run_end"] == {
        "bytes": 49 * TB,
        "bytes_by_tier": {"hot": 49 * TB, "warm": 0, "cold": 0, "archive": 0},
        "deleted_billed_bytes": 0,  # local tiers forget deleted bytes at once
        "deleted_billed_bytes_by_tier": {"hot": 0, "warm": 0, "cold": 0, "archive": 0},
        "usd_month": pytest.approx(1127.0),
    }
    assert body["keep_everything"]["at_run_end"]["bytes"] == 406 * TB
    assert body["total_usd"] == pytest.approx(1704.25 * 23 / 30)
    assert body["keep_everything"]["total_usd"] == pytest.approx(21247.5 * 23 / 30)
    assert body["savings_usd"] == pytest.approx(
        body["keep_everything"]["total_usd"] - body["total_usd"]
    )
    assert len(body["series"]) == 75 and body["series"][0]["day"] == 1
    assert set(body["series"][0]) == {
        "day",
        "bytes_by_tier",
        "bytes",
        "deleted_billed_bytes",
        "deleted_billed_bytes_by_tier",
        "usd_month",
    }
    assert body["policy"] == "default" and body["checkpoints_per_run"]["rolling"] == 360
    assert body["assumptions"]


def test_twenty_runs(cost_client: TestClient) -> None:
    body = forecast(cost_client, concurrent_runs=20, prices=FLAT)

    assert body["at_run_end"]["bytes"] == 980 * TB
    assert body["at_run_end"]["usd_month"] == pytest.approx(22_540.0)


def test_the_tiers_own_prices_by_default(cost_client: TestClient) -> None:
    """The tiers file prices hot at $0.023 and archive at $0.00099 per GB-month."""
    body = forecast(cost_client)

    assert body["at_run_end"]["usd_month"] == pytest.approx(1127.0)
    day45 = body["series"][44]
    assert day45["bytes_by_tier"]["archive"] == TB  # the final, copied at run end
    assert day45["usd_month"] == pytest.approx(49_000 * 0.023 + 1000 * 0.00099)
    assert body["prices"]["archive"]["storage_gb_month"] == 0.00099


def test_size_from_parameters_and_defaults(cost_client: TestClient) -> None:
    request = {k: v for k, v in EXAMPLE.items() if k not in ("checkpoint_bytes", "horizon_days")}
    response = cost_client.post("/v1/forecast", json={**request, "parameters": 70e9})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["checkpoint_bytes"] == 980 * 10**9  # 14 bytes per parameter
    assert body["horizon_days"] == 75  # run + 30


def test_an_inline_policy(cost_client: TestClient) -> None:
    policy = {
        "name": "only-rolling",
        "rules": [{"name": "roll", "class": "rolling", "keep_last": 5, "action": "delete"}],
    }
    body = forecast(cost_client, policy=policy)

    assert body["policy"] == "only-rolling"
    assert body["at_run_end"]["bytes"] == (5 + 45 + 1) * TB


def test_a_what_if_from_the_catalog(cost_client: TestClient) -> None:
    body = forecast(cost_client, prices={"cold": {"catalog": "aws/GLACIER_IR"}})

    cold = body["prices"]["cold"]
    assert cold["catalog"] == "aws/GLACIER_IR" and cold["min_storage_days"] == 90
    assert cold["sources"]["retrieval_gb"]["url"].startswith("https://aws.amazon.com/")
    assert body["series"][-1]["bytes_by_tier"]["cold"] == 5 * TB


def test_a_star_prices_every_tier(cost_client: TestClient) -> None:
    """`*` is every tier, as `ckpt forecast --price '*=0.023'` has it: the same answer as
    naming each tier, the worked example at $0.023 per GB-month."""
    body = forecast(cost_client, prices={"*": {"storage_gb_month": 0.023}})

    assert {tier: q["storage_gb_month"] for tier, q in body["prices"].items()} == {
        tier: 0.023 for tier in FLAT
    }
    assert body["at_run_end"]["usd_month"] == pytest.approx(49 * TB / 10**9 * 0.023)
    assert body == forecast(cost_client, prices=FLAT)


def test_a_tier_named_beside_the_star_wins_over_it(cost_client: TestClient) -> None:
    """Figure by figure; a catalog named on the tier starts it afresh from that entry."""
    glacier = catalog()["aws/GLACIER_IR"].figures
    star = {"storage_gb_month": 0.023, "egress_gb": 0.5}

    body = forecast(
        cost_client,
        prices={
            "archive": {"storage_gb_month": 0.001},
            "cold": {"catalog": "aws/GLACIER_IR"},
            "*": star,
        },
    )

    prices = body["prices"]
    assert (prices["hot"]["storage_gb_month"], prices["hot"]["egress_gb"]) == (0.023, 0.5)
    assert (prices["archive"]["storage_gb_month"], prices["archive"]["egress_gb"]) == (0.001, 0.5)
    assert prices["cold"]["catalog"] == "aws/GLACIER_IR"
    assert prices["cold"]["storage_gb_month"] == glacier["storage_gb_month"] != 0.023
    assert prices["cold"]["egress_gb"] == glacier["egress_gb"] != 0.5


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"policy": {"name": "p", "rules": [{"name": "r", "action": {"move_to": "x"}}]}}, "policy"),
        ({"parameters": 70e9}, "checkpoint_bytes"),
        ({"bytes_per_parameter": 12}, "bytes_per_parameter"),
        ({"checkpoint_bytes": 1.5}, "checkpoint_bytes"),
        ({"checkpoint_bytes": "1e12"}, "checkpoint_bytes"),
        ({"checkpoint_bytes": 0}, "checkpoint_bytes"),
        ({"run_days": 0}, "run_days"),
        ({"run_days": 10**6}, "run_days"),
        ({"horizon_days": 0}, "horizon_days"),
        ({"concurrent_runs": 0}, "concurrent_runs"),
        ({"schedule": {}}, "schedule"),
        ({"schedule": {"rolling": "soon"}}, "schedule.rolling"),
        ({"schedule": {"rolling": "0s"}}, "schedule.rolling"),
        ({"schedule": {"rolling": "1m"}}, "schedule"),
        ({"schedule": {"Rolling!": "1h"}}, "schedule"),
        ({"prices": {"nowhere": {"storage_gb_month": 1}}}, "prices.nowhere"),
        ({"prices": {"hot": {"catalog": "aws/NOPE"}}}, "prices.hot.catalog"),
        ({"prices": {"hot": {"storage_gb_month": -1}}}, "prices.hot.storage_gb_month"),
        ({"prices": {"*": {"catalog": "aws/NOPE"}}}, "prices.*.catalog"),
        ({"prices": {"*": {"storage_gb_month": -1}}}, "prices.*.storage_gb_month"),
        ({"prices": {"hot*": {"storage_gb_month": 1}}}, "prices"),
        ({"metrics": "random"}, "metrics"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_forecasts_are_problems_naming_the_field(
    cost_client: TestClient, changes: dict[str, Any], field: str
) -> None:
    response = cost_client.post("/v1/forecast", json={**EXAMPLE, **changes})
    assert_problem(response, 422, field)


def test_a_policy_name_that_names_nothing_is_a_404(cost_client: TestClient) -> None:
    response = cost_client.post("/v1/forecast", json={**EXAMPLE, "policy": "nope"})
    assert "nope" in assert_problem(response, 404, "policy")["detail"]


def test_a_body_that_is_not_json_is_a_problem(cost_client: TestClient) -> None:
    response = cost_client.post(
        "/v1/forecast", content=b"{", headers={"content-type": "application/json"}
    )
    assert_problem(response, 400, "body")


# --- the planner -------------------------------------------------------------------------------


def test_the_planner_answers_what_its_inputs_allow(cost_client: TestClient) -> None:
    response = cost_client.post(
        "/v1/planner",
        json={
            "parameters": 70e9,
            "interval": "1h",
            "allowed_overlap": 0.1,
            "checkpoint_write_seconds": 60,
            "mtbf": "24h",
            "checkpoints": 1000,
            "gpus": 8,
            "usd_per_gpu_hour": 4.06,
        },
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "bytes_per_parameter": 14.0,
        "checkpoint_bytes": 980 * 10**9,
        "write_bandwidth_bytes_per_s": pytest.approx(980e9 / 360),
        "young_daly_interval_s": pytest.approx(3219.937887599697),
        "sync_stall_gpu_hours": pytest.approx(1000 * 60 * 8 / 3600),
        "sync_stall_usd": pytest.approx(1000 * 60 * 8 / 3600 * 4.06),
        "incomplete": {},
    }


def test_outputs_without_their_inputs_are_absent(cost_client: TestClient) -> None:
    response = cost_client.post(
        "/v1/planner", json={"parameters": 405e9, "recipe": "fp32-master-adam"}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "bytes_per_parameter": 12.0,
        "checkpoint_bytes": 4860 * 10**9,
        "incomplete": {},
    }
    partial = cost_client.post("/v1/planner", json={"checkpoint_write_seconds": 45, "gpus": 64})
    assert partial.json() == {"incomplete": {"sync_stall_gpu_hours": ["checkpoints"]}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"parameters": 70e9, "recipe": "fp32-master-adam", "bytes_per_parameter": 12}, "recipe"),
        ({"parameters": 70e9, "checkpoint_bytes": 1e12}, "checkpoint_bytes"),
        ({"bytes_per_parameter": 12}, "bytes_per_parameter"),
        ({"parameters": 70e9, "recipe": "sgd"}, "recipe"),
        ({"parameters": "70e9"}, "parameters"),
        ({"parameters": 70e9, "interval": "hourly"}, "interval"),
        ({"parameters": 70e9, "interval": "1h", "allowed_overlap": 1.5}, "allowed_overlap"),
        ({"checkpoint_write_seconds": -1, "mtbf": "24h"}, "checkpoint_write_seconds"),
        ({"gpus": 0}, "gpus"),
        ({"parameters": 70e9, "typo": 1}, "typo"),
    ],
)
def test_bad_sizing_questions_are_problems(
    cost_client: TestClient, body: dict[str, Any], field: str
) -> None:
    assert_problem(cost_client.post("/v1/planner", json=body), 422, field)


def test_a_sizing_question_without_inputs_has_no_outputs(cost_client: TestClient) -> None:
    # Every input is optional in the document, so no input at all is a question too: each
    # output is present when its inputs are given, here none.
    response = cost_client.post("/v1/planner", json={})

    assert response.status_code == 200, response.text
    assert response.json() == {"incomplete": {}}


@pytest.mark.parametrize("policy", [[], 7, "Not A Name"])
def test_a_policy_neither_named_nor_inline_is_one_problem(
    cost_client: TestClient, policy: Any
) -> None:
    response = cost_client.post("/v1/forecast", json={**EXAMPLE, "policy": policy})
    assert_problem(response, 422, "policy")
    assert [e["field"] for e in response.json()["errors"]] == ["policy"]


def test_an_inline_policy_error_names_its_rule_and_field_once(cost_client: TestClient) -> None:
    rules = [{"name": "r", "class": "rolling", "keep_last": -5, "action": "delete"}]
    response = cost_client.post(
        "/v1/forecast", json={**EXAMPLE, "policy": {"name": "p", "rules": rules}}
    )
    assert_problem(response, 422)
    body = response.json()
    assert body["field"] == "policy.rules[0] (r).keep_last"
    assert body["detail"].count("keep_last") == 1


def test_a_catalog_entry_in_any_case(cost_client: TestClient) -> None:
    body = forecast(cost_client, prices={"hot": {"catalog": "aws/standard"}})
    assert body["prices"]["hot"]["catalog"] == "aws/STANDARD"
    assert body["at_run_end"]["usd_month"] == pytest.approx(1127.0)


def test_a_planner_checkpoint_beyond_an_exabyte_is_refused(cost_client: TestClient) -> None:
    response = cost_client.post(
        "/v1/planner", json={"parameters": 1e18, "bytes_per_parameter": 1e6}
    )
    assert_problem(response, 422, "parameters")
