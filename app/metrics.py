"""Prometheus metrics of this process: what its workers, sweeps and storage calls did.

Counters and histograms here are per process: a `ckpt worker` or `ckpt scheduler` counts
what it did itself, and the API's `/metrics` shows the API process's own (plus, at each
scrape, the ledger and the catalog read from the database, which every replica shares:
see app/api/metrics.py). Label values are small closed sets (action kinds and states,
storage providers, tiers, sweep triggers), never ids or keys.

Only prometheus_client and the standard library are imported, so the storage adapters
can count without depending on anything above them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import ParamSpec, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from app.domain import states

P = ParamSpec("P")
R = TypeVar("R")

ACTIONS_FINISHED = Counter(
    "ckpt_actions_finished",
    "Actions this process's workers brought to a final state (done, failed, cancelled).",
    ["kind", "state"],
)
ACTION_RETRIES = Counter(
    "ckpt_action_storage_retries",
    "Transient storage errors retried while this process's workers executed actions.",
    ["kind"],
)
STORAGE_RETRIES = Counter(
    "ckpt_storage_retries",
    "Transient storage errors (throttling, 5xx, timeouts, resets) that were retried.",
    ["operation", "provider"],
)
TRANSFER_BYTES = Counter(
    "ckpt_transfer_bytes",
    "Checkpoint bytes copied between storages: `streamed` through this process, "
    "`server_side` by the provider, `class_change` rewritten in place.",
    ["method", "source", "dest"],
)
PURGED_BYTES = Counter(
    "ckpt_purged_bytes",
    "Checkpoint bytes removed from a tier by purges (a checkpoint's size per location).",
    ["tier"],
)
SWEEP_DURATION = Histogram(
    "ckpt_sweep_duration_seconds",
    "Time to evaluate policies and write the planned actions to the ledger.",
    ["trigger"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
CLAIM_LAG = Histogram(
    "ckpt_action_claim_lag_seconds",
    "How long after it became due a worker claimed an action.",
    ["kind"],
    buckets=(0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600),
)
RECONCILE_FINDINGS = Gauge(
    "ckpt_reconcile_findings",
    "What this process's last reconciliation found: `orphans` (objects no checkpoint "
    "owns), `drift` (checkpoints missing or changed files), `objects` (scanned).",
    ["finding"],
)
RECONCILE_LAST = Gauge(
    "ckpt_reconcile_last_run_timestamp_seconds",
    "When this process last finished a reconciliation (Unix time).",
)

# URL scheme of a tier -> the provider label of every metric here
_PROVIDERS = {"file": "local", "s3": "s3", "gs": "gcs"}


def provider(scheme: str) -> str:
    return _PROVIDERS.get(scheme, scheme)


def action_claimed(kind: str, due_at: datetime, now: datetime) -> None:
    """A worker claimed an action at `now` that became due at `due_at`: its due time, or for
    an action taken over from a dead worker, the moment that worker's lease ran out."""
    CLAIM_LAG.labels(kind=kind).observe(max(timedelta(0), now - due_at).total_seconds())


def action_executed(kind: str, state: str, retries: int) -> None:
    """One execution of an action ended, leaving it in `state` after `retries` storage retries."""
    if retries:
        ACTION_RETRIES.labels(kind=kind).inc(retries)
    if state in states.FINAL_STATES:
        ACTIONS_FINISHED.labels(kind=kind, state=state).inc()


def storage_retried(operation: str, provider: str) -> None:
    STORAGE_RETRIES.labels(operation=operation, provider=provider).inc()


def bytes_transferred(method: str, source_scheme: str, dest_scheme: str, size: int) -> None:
    if size > 0:
        TRANSFER_BYTES.labels(
            method=method, source=provider(source_scheme), dest=provider(dest_scheme)
        ).inc(size)


def bytes_purged(size: int, tiers: list[str]) -> None:
    """A purge removed a checkpoint of `size` bytes from each of `tiers`."""
    for tier in tiers:
        if size > 0:
            PURGED_BYTES.labels(tier=tier).inc(size)


def timed_sweep(run: Callable[P, R]) -> Callable[P, R]:
    """Observe each call's duration in SWEEP_DURATION, labelled by its `trigger` argument
    (keyword-only in the sweep functions); a sweep that raises is observed too."""

    @functools.wraps(run)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            trigger = str(kwargs.get("trigger", "unknown"))
            SWEEP_DURATION.labels(trigger=trigger).observe(time.perf_counter() - started)

    return timed


def reconciled(orphans: int, drifting: int, objects: int) -> None:
    RECONCILE_FINDINGS.labels(finding="orphans").set(orphans)
    RECONCILE_FINDINGS.labels(finding="drift").set(drifting)
    RECONCILE_FINDINGS.labels(finding="objects").set(objects)
    RECONCILE_LAST.set_to_current_time()
