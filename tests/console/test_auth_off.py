"""With CKPT_AUTH=off (the quick start) the console asks for no token and offers every
change, as the API allows them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.client.conftest import Service
from tests.console.conftest import CHROMIUM


@pytest.fixture
def open_service(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path, f"sqlite:///{tmp_path / 'ckpt.db'}")
    service.env["CKPT_AUTH"] = "off"
    service.env.pop("CKPT_BOOTSTRAP_TOKEN")
    service.start()  # `ckpt serve` migrates its own database
    try:
        yield service
    finally:
        service.stop()


def test_no_sign_in_when_auth_is_off(browser: Browser, open_service: Service) -> None:
    assert CHROMIUM.exists()
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(open_service.url)  # `/` leads to the console
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("authentication off")).to_be_visible()
    expect(page.get_by_label("API token")).to_have_count(0)
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    expect(page.get_by_role("button", name="Scan now")).to_be_visible()
    page.get_by_role("link", name="Policies").click()
    expect(page.get_by_role("link", name="New policy")).to_be_visible()
    page.close()
    assert errors == []
