"""What the shadow-policy tests share: priced local tiers, the policies, and the service's
evaluations driven by hand (the test apps run no background thread)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db.models import ShadowAction
from app.db.session import session_scope
from app.services.lifecycle.sweep import requested_evaluations, run_sweep
from app.settings import Settings
from tests.builders import with_tiers

# USD per GB-month of the four local tiers (S3 Standard, Standard-IA, Glacier IR, Deep Archive)
TIER_PRICES = {"hot": 0.023, "warm": 0.0125, "cold": 0.004, "archive": 0.00099}
GB = 10**9

# In force: it deletes old `debug` checkpoints and leaves everything else alone.
ENFORCED = """\
name: default
rules:
  - {name: debug-keep-1, class: debug, keep_last: 1, action: delete}
"""

# The candidate, in shadow mode on the project `proj`.
SHADOW = """\
name: candidate
mode: shadow
applies_to: {projects: [proj]}
priority: 10
rules:
  - {name: rolling-keep-2, class: rolling, keep_last: 2, action: delete}
  - {name: milestones-cold, class: milestone, when: {age: 2d}, action: {move_to: cold}}
  - {name: final-archive, class: final, when: {run_ended: 0s}, action: {copy_to: archive}}
"""


def priced(settings: Settings) -> Settings:
    """`settings` with the four local tiers under its data directory, priced."""
    root = settings.data_dir
    tiers = [
        {"name": n, "url": f"file://{(root / n).resolve()}", "price": {"storage_gb_month": p}}
        for n, p in TIER_PRICES.items()
    ]
    return with_tiers(settings, tiers)


def usd_month(tier: str, size: int) -> float:
    return size / GB * TIER_PRICES[tier]


def evaluate_requested(app: FastAPI, now: datetime) -> None:
    """What the evaluator thread does: evaluate each run whose evaluation was asked for."""
    factory = app.state.session_factory
    with session_scope(factory) as session:
        batch = requested_evaluations(session, before=now)
    for run_id, requested_at in batch:
        run_sweep(
            factory,
            tiers=app.state.tiers,
            now=now,
            trigger="registration",
            run_id=run_id,
            answers_request=requested_at,
        )


def periodic_sweep(app: FastAPI, now: datetime) -> None:
    """What the scheduler's sweep does: the due runs only."""
    run_sweep(
        app.state.session_factory,
        tiers=app.state.tiers,
        now=now,
        trigger="schedule",
        due_only=True,
    )


def shadow(
    client: TestClient | httpx.Client, name: str = "candidate", **params: Any
) -> dict[str, Any]:
    response = client.get(f"/v1/policies/{name}/shadow", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def shadow_rows(app: FastAPI) -> list[ShadowAction]:
    """Every row of the shadow ledger, oldest first, then by run and step."""
    with session_scope(app.state.session_factory) as session:
        rows = list(
            session.execute(
                select(ShadowAction).order_by(
                    ShadowAction.created_at, ShadowAction.run_id, ShadowAction.step
                )
            ).scalars()
        )
        session.expunge_all()
        return rows
