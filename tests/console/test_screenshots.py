"""Screenshots of every page, on a laptop and on a phone, taken from the real console.

They go to `CKPT_CONSOLE_SCREENSHOTS` when it names a directory (`make screenshots` puts
them in docs/console/, where docs/console.md shows them), else to the test's own
directory; either way each must be a picture of the page it names, not of an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.console.conftest import Catalog, open_page, sign_in

PAGES = [
    ("overview", "#/", "Overview"),
    ("runs", "#/runs", "Runs"),
    ("run", "#/runs/{run}", "resnet-50"),
    ("policies", "#/policies", "Policies"),
    ("policy-editor", "#/policies/default", "Policy default"),
    ("forecast", "#/forecast", "Forecast"),
    ("ledger", "#/ledger", "Ledger"),
    ("audit", "#/audit", "Audit"),
]
SIZES = {"laptop": (1280, 860), "phone": (390, 844)}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_page_pictured(browser: Browser, catalog: Catalog, tmp_path: Path, size: str) -> None:
    wanted = os.environ.get("CKPT_CONSOLE_SCREENSHOTS")
    # one database's pictures are enough for the documentation
    out = (
        Path(wanted)
        if wanted and "sqlite" in catalog.service.env["CKPT_DATABASE_URL"]
        else tmp_path
    )
    out.mkdir(parents=True, exist_ok=True)
    width, height = SIZES[size]
    page, recorder = open_page(browser, catalog, width=width, height=height)
    sign_in(page, catalog)
    for name, route, heading in PAGES:
        page.goto(f"{catalog.url}/console/{route.format(run=catalog.runs['resnet-50']['id'])}")
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        expect(page.get_by_text("Loading…")).to_have_count(0)
        if name == "forecast":
            page.get_by_role("button", name="Forecast").click()
            expect(page.locator("svg[data-chart='lines'] path[data-series]")).to_have_count(2)
        if name == "policy-editor":
            page.get_by_role("button", name="Preview changes").click()
            expect(page.get_by_text("actions added")).to_be_visible()
        if size == "laptop":  # no page wider than the screen (a phone scrolls its tables)
            assert page.evaluate("document.documentElement.scrollWidth") <= width
        target = out / f"{name}-{size}.png"
        page.screenshot(path=str(target), full_page=True)
        assert target.stat().st_size > 10_000
    page.context.close()
    assert recorder.foreign() == [] and recorder.errors == []
