"""An app serving the cost routes on priced local tiers, with the shipped default policy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.cost.helpers import SHIPPED_POLICY

# USD per GB-month of each local tier: S3 Standard, Standard-IA, Glacier IR, Deep Archive.
TIER_PRICES = {"hot": 0.023, "warm": 0.0125, "cold": 0.004, "archive": 0.00099}


def cost_app(settings: Settings, engine: Engine) -> FastAPI:
    """The service app as `ckpt serve` builds it (no background work): it serves the cost
    routes itself."""
    return create_app(settings, engine=engine, roles=NO_BACKGROUND)


@pytest.fixture
def priced_settings(settings: Settings, data_dir: Path, tmp_path: Path) -> Settings:
    """Four local tiers under the data directory, priced; the shipped policy loaded."""
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(
        "tiers:\n"
        + "".join(
            f"  - name: {name}\n"
            f"    url: file://{(data_dir / name).resolve()}\n"
            f"    price: {{storage_gb_month: {price}}}\n"
            for name, price in TIER_PRICES.items()
        )
    )
    settings.policies_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED_POLICY, settings.policies_dir / "default.yaml")
    return settings.model_copy(update={"tiers_file": tiers_file})


@pytest.fixture
def priced_app(priced_settings: Settings, clean_engine: Engine) -> FastAPI:
    return cost_app(priced_settings, clean_engine)


@pytest.fixture
def cost_client(priced_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(priced_app) as client:
        yield client
