"""`GET /metrics`: Prometheus text with the ledger, the tiers, the work the workers did and
the storage retries, each retry also counted against the action that needed it."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from app.api import auth
from app.db.session import session_scope
from app.services.lifecycle.trash import enqueue_due_purges
from app.storage import retry, transfer
from app.storage.base import TransientError
from app.storage.local import LocalStorage
from tests.builders import (
    end_run,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    step_files,
    sweep_now,
    tier_usage,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

DEMOTE = """\
name: default
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
  - name: milestones-warm
    class: milestone
    when: {run_ended: 0s}
    action: {move_to: warm}
"""


@pytest.fixture(autouse=True)
def metrics_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The access rule of /metrics (`read`), until the rule table has it."""
    if ("GET", "/metrics") not in auth.RULES:
        rules = {**auth.RULES, ("GET", "/metrics"): auth.READ}
        monkeypatch.setattr(auth, "RULES", MappingProxyType(rules))


@pytest.fixture(autouse=True)
def instant_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "backoff", lambda attempt, **_: 0.0)


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain"), response.headers
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series not created yet."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def later(hours: float = 1) -> datetime:
    return datetime.now(UTC) + timedelta(hours=hours)


def test_ledger_gauge_counts_every_action_by_kind_and_state(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    put_policy(client, DEMOTE)
    run = make_run(client)
    for step in (1, 2, 3):
        place_checkpoint(client, data_dir, run, step)
    for step in (10, 20):
        place_checkpoint(client, data_dir, run, step, "milestone")
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    sweep_now(client)
    before = scrape(client)

    planned = {(a["kind"], a["state"]) for a in ledger(client)}
    assert planned == {("delete", "pending"), ("move", "pending")}
    assert value(before, "ckpt_actions", kind="delete", state="pending") == 2
    assert value(before, "ckpt_actions", kind="move", state="pending") == 2
    assert value(before, "ckpt_actions", kind="purge", state="done") == 0  # zeros are shown
    assert value(before, "ckpt_sweep_duration_seconds_count", trigger="manual") >= 1

    assert make_executor(app, clock=later).drain() == 4
    after = scrape(client)

    assert value(after, "ckpt_actions", kind="delete", state="pending") == 0
    assert value(after, "ckpt_actions", kind="delete", state="done") == 2
    assert value(after, "ckpt_actions", kind="move", state="done") == 2
    finished = "ckpt_actions_finished_total"
    for kind, count in (("delete", 2), ("move", 2)):
        grew = value(after, finished, kind=kind, state="done") - value(
            before, finished, kind=kind, state="done"
        )
        assert grew == count, kind
        lag = "ckpt_action_claim_lag_seconds"
        claims = value(after, f"{lag}_count", kind=kind) - value(before, f"{lag}_count", kind=kind)
        assert claims == count, kind
        # claimed an hour after they became due: in the buckets above 30 min, none below
        waited = value(after, f"{lag}_bucket", kind=kind, le="1800.0") - value(
            before, f"{lag}_bucket", kind=kind, le="1800.0"
        )
        assert waited == 0, kind
    moved = sum(len(data) for step in (10, 20) for data in step_files(step).values())
    streamed = value(
        after, "ckpt_transfer_bytes_total", method="streamed", source="local", dest="local"
    ) - value(before, "ckpt_transfer_bytes_total", method="streamed", source="local", dest="local")
    assert streamed == moved


def test_tier_gauges_match_the_tiers_api(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    place_checkpoint(client, data_dir, run, 1)
    place_checkpoint(client, data_dir, run, 2, tier="warm")
    place_checkpoint(client, data_dir, run, 3, tier="warm")

    samples = scrape(client)

    usage = tier_usage(client)
    assert set(usage) == {"hot", "warm", "cold", "archive"}
    for tier, held in usage.items():
        assert value(samples, "ckpt_tier_bytes", tier=tier) == held["bytes"], tier
        assert value(samples, "ckpt_tier_checkpoints", tier=tier) == held["checkpoints"], tier
    assert value(samples, "ckpt_tier_checkpoints", tier="warm") == 2
    assert value(samples, "ckpt_tier_bytes", tier="cold") == 0


class FlakyDeletes:
    """Local deletes that fail transiently the first `failures` times, retried like a
    provider call, one of them on a thread of a pool as the adapters' batch deletes are."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
        self.left = failures
        self.lock = threading.Lock()
        original = LocalStorage.delete_prefix

        def flaky_delete(storage: LocalStorage, prefix: str) -> int:
            def attempt(_entry: Any = None) -> None:
                with self.lock:
                    self.left -= 1
                    if self.left >= 0:
                        raise TransientError("503 SlowDown (injected)")

            transfer.run_parallel(
                lambda entry: retry.retrying(attempt, what=f"delete file://{prefix}"),
                [{"path": "a"}, {"path": "b"}],
                2,
            )
            return original(storage, prefix)

        monkeypatch.setattr(LocalStorage, "delete_prefix", flaky_delete)


def test_retries_are_counted_per_provider_and_per_action(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = make_run(client)
    checkpoint = place_checkpoint(client, data_dir, run, 7)
    assert client.delete(f"/v1/checkpoints/{checkpoint['id']}").status_code == 202
    assert make_executor(app).drain() == 1  # to the trash
    with session_scope(app.state.session_factory) as session:
        assert enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC)) == 1
    (purge,) = ledger(client, kind="purge")
    FlakyDeletes(monkeypatch, failures=3)
    before = scrape(client)
    caplog.set_level(logging.INFO, logger="app.worker")

    assert make_executor(app).drain() == 1

    after = scrape(client)
    assert client.get(f"/v1/actions/{purge['id']}").json()["state"] == "done"
    retries = value(
        after, "ckpt_storage_retries_total", operation="delete", provider="local"
    ) - value(before, "ckpt_storage_retries_total", operation="delete", provider="local")
    assert retries == 3
    per_action = value(after, "ckpt_action_storage_retries_total", kind="purge") - value(
        before, "ckpt_action_storage_retries_total", kind="purge"
    )
    assert per_action == 3
    (line,) = [
        record.__dict__
        for record in caplog.records
        if record.getMessage() == "action finished"
        and record.__dict__.get("action_id") == purge["id"]
    ]
    assert (line["kind"], line["state"], line["retries"]) == ("purge", "done", 3)
    size = checkpoint["size_bytes"]
    purged = value(after, "ckpt_purged_bytes_total", tier="hot") - value(
        before, "ckpt_purged_bytes_total", tier="hot"
    )
    assert purged == size


def test_a_tally_counts_the_retries_of_its_own_block_and_its_threads() -> None:
    failures = {"left": 0}
    lock = threading.Lock()

    def flaky() -> str:
        with lock:
            failures["left"] -= 1
            if failures["left"] >= 0:
                raise TransientError("429")
        return "ok"

    def work(_entry: Any) -> None:
        retry.retrying(flaky, what="GetObject s3://bucket/key", sleep=lambda _: None)

    labels = {"operation": "read", "provider": "s3"}
    process_before = REGISTRY.get_sample_value("ckpt_storage_retries_total", labels) or 0
    with retry.counting_retries() as outer:
        failures["left"] = 4
        transfer.run_parallel(work, [{"path": str(i)} for i in range(4)], 4)
        with retry.counting_retries() as inner:
            failures["left"] = 1
            work({})
        assert inner.count == 1
    assert outer.count == 4  # the nested block counted its own
    failures["left"] = 2
    work({})  # outside any block: only the process's metric counts these
    assert outer.count == 4
    process_after = REGISTRY.get_sample_value("ckpt_storage_retries_total", labels) or 0
    assert process_after - process_before == 7


def test_retries_are_classified_by_operation_and_provider() -> None:
    assert retry.classify("PutObject s3://b/k") == ("write", "s3")
    assert retry.classify("UploadPartCopy 2 to s3://b/k") == ("copy", "s3")
    assert retry.classify("DeleteObjects of 3 keys under s3://b/p") == ("delete", "s3")
    assert retry.classify("read gs://b/k") == ("read", "gcs")
    assert retry.classify("batch delete in gs://b") == ("delete", "gcs")
    assert retry.classify("something else") == ("other", "unknown")


def test_a_scraper_asking_for_openmetrics_gets_it(client: TestClient) -> None:
    response = client.get(
        "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    assert 'ckpt_tier_bytes{tier="hot"} 0' in response.text
