"""The console's files as the API process serves them: open to anyone (the pages show
only what the token they are given reads), from the package only, each with a policy
that keeps the browser on this origin."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.builders import assert_problem


def test_the_service_address_leads_to_the_console(client: TestClient) -> None:
    for path in ("/", "/console"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 307
        assert response.headers["location"] == "/console/"


def test_pages_and_scripts_are_served_without_a_token(auth_client: TestClient) -> None:
    client = auth_client  # access control on, and no token sent
    assert_problem(client.get("/v1/tiers"), 401)
    page = client.get("/console/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/js/app.js">' in page.text
    script = client.get("/console/js/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "probe" in script.text
    for response in (page, script, client.get("/console/console.css")):
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path",
    [
        "/console/nothing.js",
        "/console/js",  # a directory
        "/console/%2e%2e/__init__.py",
        "/console/js/%2e%2e/%2e%2e/__init__.py",
        "/console/.hidden.js",
        "/console/index.py",
    ],
)
def test_nothing_but_the_console_s_own_files(client: TestClient, path: str) -> None:
    assert_problem(client.get(path), 404)
