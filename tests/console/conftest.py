"""The console in a real browser: Debian's Chromium driven by Playwright, against a real
`ckpt serve` with access control on, on SQLite and on PostgreSQL.

Each module gets one service per database with a small catalog of its own (`Catalog`),
written as a training job would (files on the tiers, then registrations over HTTP). Every
page a test opens records the requests it makes; a request to any other origin fails the
test that made it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from tests.builders import remember_secret, write_checkpoint
from tests.client.conftest import ADMIN, Service
from tests.conftest import migrated_database

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
KEEP_ALL = "name: keep-all\ndescription: keeps everything\npriority: -1\nrules: []\n"
NIGHTLY = """name: nightly
description: short-lived sandbox runs
applies_to: {projects: ["sandbox-*"]}
priority: 5
rules:
  - name: rolling-keep-5
    class: rolling
    keep_last: 5
    action: delete
"""
MiB = 1024 * 1024
GB = 10**9
# the tiers of `ckpt serve`'s default, priced like S3 Standard, Standard-IA, Glacier IR and
# Deep Archive, so that the console has costs to show
PRICES = {"hot": 0.023, "warm": 0.0125, "cold": 0.004, "archive": 0.00099}
NOW = datetime.now(UTC)


@dataclass
class Catalog:
    """What a module's service holds, by the names the tests look for."""

    service: Service
    read_token: str
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    held_sweep: str = ""

    @property
    def url(self) -> str:
        return self.service.url


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    assert CHROMIUM.exists(), (
        "the console's tests drive Debian's Chromium: apt-get install chromium "
        "(.ci/run installs it when it is missing)"
    )
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    yield browser
    browser.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def catalog(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Catalog]:
    for url in migrated_database(request.param, tmp_path_factory):
        root = tmp_path_factory.mktemp("console")
        tiers = [
            {
                "name": name,
                "url": f"file://{root / 'data' / name}",
                "price": {"storage_gb_month": price},
            }
            for name, price in PRICES.items()
        ]
        (root / "tiers.yaml").write_text(yaml.safe_dump({"tiers": tiers}))
        service = Service(root, url, CKPT_TIERS_FILE=str(root / "tiers.yaml"))
        policies = root / "policies"
        shutil.copy(ROOT / "policies" / "default.yaml", policies / "default.yaml")
        (policies / "keep-all.yaml").write_text(KEEP_ALL)
        (policies / "nightly.yaml").write_text(NIGHTLY)
        service.start()
        try:
            yield seed(service)
        finally:
            service.stop()
            assert ADMIN not in service.logs(), "the admin token is in the service's logs"


def seed(service: Service) -> Catalog:
    """Three projects: `vision` with a finished run whose rolling checkpoints the default
    policy thins past the blast radius (a held sweep); `llm` with an active run whose
    milestones lie on `cold`; `sandbox-a` with a short run."""
    with service.admin() as admin:
        made = admin.post(
            "/v1/tokens", json={"name": "viewer", "scopes": ["read"], "projects": ["*"]}
        )
        assert made.status_code == 201, made.text
        read_token = remember_secret(made.json()["token"])
        catalog = Catalog(service=service, read_token=read_token)

        def run(project: str, name: str) -> dict[str, Any]:
            made = admin.post(
                "/v1/runs", json={"project": project, "name": name, "policy": "keep-all"}
            )
            assert made.status_code == 201, made.text
            catalog.runs[name] = made.json()
            return catalog.runs[name]

        def checkpoint(name: str, step: int, klass: str, tier: str, size: int) -> None:
            """Sizes as a real run's (tens of GB, so that $/month reads as money), in
            sparse files that take no disk; a checkpoint the tests copy is small."""
            run_row = catalog.runs[name]
            files = {"model.safetensors": b"weights", "optim.pt": b"o" * 4096}
            relative = f"{run_row['project']}/{name}/step-{step}"
            uri = write_checkpoint(service.tier_dir(tier), relative, files)
            os.truncate(service.tier_dir(tier) / relative / "model.safetensors", size)
            body = {
                "step": step,
                "class": klass,
                "uri": uri,
                "metrics": {"eval_loss": 3.0 - step / 1000},
                # a day old: past the 60 s every new checkpoint is protected for
                "created_at": (NOW - timedelta(days=1, seconds=-step)).isoformat(),
            }
            made = admin.post(f"/v1/runs/{run_row['id']}/checkpoints", json=body)
            assert made.status_code == 201, made.text
            catalog.checkpoints[(name, step)] = made.json()

        run("vision", "resnet-50")
        for step in range(100, 900, 100):
            checkpoint("resnet-50", step, "rolling", "hot", 40 * GB + step * 10**7)
        run("llm", "gpt-small")
        for step in (1000, 2000, 3000):  # 2000 is restored onto hot by a test: bytes copied
            checkpoint("gpt-small", step, "milestone", "cold", MiB if step == 2000 else 300 * GB)
        checkpoint("gpt-small", 3500, "rolling", "hot", 300 * GB)
        run("sandbox-a", "try-1")
        checkpoint("try-1", 10, "rolling", "hot", 5 * GB)

        # the finished run comes under the default policy: 5 of the project's 8 rolling
        # checkpoints to delete is past the blast radius, so the deletes are held
        ended = admin.patch(
            f"/v1/runs/{catalog.runs['resnet-50']['id']}",
            json={"status": "completed", "policy": "default"},
        )
        assert ended.status_code == 200, ended.text
        # the scheduler evaluates the run on its own; a sweep now makes it certain (an
        # evaluation never plans an action twice)
        assert admin.post("/v1/sweeps", json={"project": "vision"}).status_code == 202
        held = admin.get("/v1/actions", params={"state": "held"}).json()["items"]
        sweeps = {a["sweep_id"] for a in held}
        assert len(held) == 5 and len(sweeps) == 1, held
        catalog.held_sweep = sweeps.pop()
    return catalog


@pytest.fixture
def admin_api(catalog: Catalog) -> Iterator[httpx.Client]:
    with catalog.service.admin() as client:
        yield client


class Recorder:
    """Every request a page makes, to check none leaves the service's origin."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.urls: list[str] = []
        self.errors: list[str] = []

    def foreign(self) -> list[str]:
        return [
            url
            for url in self.urls
            if urlsplit(url).scheme not in ("data", "blob")
            and f"{urlsplit(url).scheme}://{urlsplit(url).netloc}" != self.origin
        ]


def open_page(
    browser: Browser, catalog: Catalog, *, width: int = 1280, height: int = 860
) -> tuple[Page, Recorder]:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    recorder = Recorder(catalog.url)
    page.on("request", lambda request: recorder.urls.append(request.url))
    page.on("pageerror", lambda error: recorder.errors.append(str(error)))
    # a refused request is logged by the browser as "Failed to load resource": the pages
    # show those themselves; anything else logged as an error is a script's failure
    page.on(
        "console",
        lambda message: (
            recorder.errors.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.set_default_timeout(15_000)
    return page, recorder


@pytest.fixture
def recorded(browser: Browser, catalog: Catalog) -> Iterator[tuple[Page, Recorder]]:
    page, recorder = open_page(browser, catalog)
    yield page, recorder
    page.context.close()
    assert recorder.foreign() == [], "the console asked another origin"
    assert recorder.errors == [], "the console's scripts failed"


def sign_in(page: Page, catalog: Catalog, token: str = ADMIN) -> None:
    page.goto(f"{catalog.url}/console/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Overview").wait_for()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
