"""Staging a checkpoint onto a tier: ask the service for a restore, then wait for the copy.

The service does all the work (its worker copies the bytes, and for an archive class asks
the provider to restore the objects first, which can take hours); the client only asks
once and polls. Polls start quick, for the local copy that takes a second, and slow down
to one every POLL_CAP seconds, for the archive that takes a night; each poll logs one line
at INFO saying what the action is doing, so a job waiting on it is not silent.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ckpt_client.errors import Conflict, RestoreFailed
from ckpt_client.models import Checkpoint
from ckpt_client.transport import segment

if TYPE_CHECKING:
    from ckpt_client.client import Client

log = logging.getLogger("ckpt_client")

POLL_FIRST = 0.25
POLL_GROWTH = 1.5
POLL_CAP = 15.0
ENDED_BADLY = ("failed", "cancelled")


def _progress(action: dict[str, Any]) -> str:
    state = str(action.get("state"))
    done, total = action.get("bytes_done") or 0, action.get("bytes") or 0
    parts = [state]
    if action.get("phase"):
        parts.append(f"phase {action['phase']}")
    if total and state == "running":
        parts.append(f"{done}/{total} bytes")
    return ", ".join(parts)


def _arrived(checkpoint: Checkpoint, tier: str, started: float) -> Checkpoint:
    log.info(
        "step %d (%s) is on %s after %.1fs",
        checkpoint.step,
        checkpoint.id,
        tier,
        time.monotonic() - started,
    )
    return checkpoint


def stage(
    client: Client, checkpoint: Checkpoint, tier: str, *, wait: bool, timeout: float | None
) -> Checkpoint:
    """`checkpoint` once it has a location on `tier` (at once if it has one already).
    Without `wait`, asks for the restore and returns the checkpoint as it is."""
    if checkpoint.location(tier) is not None:
        return checkpoint
    started = time.monotonic()
    path = f"/v1/checkpoints/{segment(checkpoint.id)}"
    try:
        action = client._call("POST", f"{path}/restore", json={"tier": tier}).body
    except Conflict as error:
        if error.field != "tier":
            raise
        # It reached the tier between our read and our request: nothing left to copy.
        return Checkpoint.from_json(client._call("GET", path).body)
    log.info(
        "staging step %d (%s) onto %s: restore %s from %s",
        checkpoint.step,
        checkpoint.id,
        tier,
        action.get("id"),
        action.get("from_tier") or checkpoint.tier,
    )
    if not wait:
        return checkpoint
    pause = POLL_FIRST
    polls = 0
    while True:
        current = Checkpoint.from_json(client._call("GET", path).body)
        if current.location(tier) is not None:
            return _arrived(current, tier, started)
        action = client._call("GET", f"/v1/actions/{segment(str(action['id']))}").body
        state = str(action.get("state"))
        if state in ENDED_BADLY or state == "done":
            if state == "done":
                # Either it finished between our two reads, or another action moved it
                # away meanwhile; a third read tells which.
                again = Checkpoint.from_json(client._call("GET", path).body)
                if again.location(tier) is not None:
                    return _arrived(again, tier, started)
            raise RestoreFailed(
                f"staging step {checkpoint.step} ({checkpoint.id}) onto {tier} ended "
                f"{state}: {action.get('error') or 'no copy on the tier'}",
                problem=action,
            )
        polls += 1
        elapsed = time.monotonic() - started
        if timeout is not None and elapsed >= timeout:
            raise TimeoutError(
                f"step {checkpoint.step} ({checkpoint.id}) not on {tier} after {elapsed:.0f}s "
                f"(restore {action.get('id')}: {_progress(action)})"
            )
        log.info(
            "waiting for step %d (%s) to reach %s: restore %s %s (poll %d, %.0fs)",
            checkpoint.step,
            checkpoint.id,
            tier,
            action.get("id"),
            _progress(action),
            polls,
            elapsed,
        )
        time.sleep(pause if timeout is None else max(0.0, min(pause, timeout - elapsed)))
        pause = min(POLL_CAP, pause * POLL_GROWTH)
