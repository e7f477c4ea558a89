"""An import of a tree whose store does not answer is refused at once, naming `uri`,
and nothing is recorded."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.builders import assert_problem, with_tiers
from tests.storage.ports import free_port


@pytest.fixture
def settings(settings: Settings) -> Settings:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    return with_tiers(settings, [{"name": "hot", "url": "s3://nowhere/ckpt", "endpoint_url": dead}])


def test_an_unreachable_store_is_503_naming_uri(client: TestClient) -> None:
    response = client.post("/v1/imports", json={"uri": "s3://nowhere/ckpt/old", "project": "p"})
    problem = assert_problem(response, 503, "uri")
    assert "s3://nowhere/ckpt/old" in problem["detail"]
    assert client.get("/v1/imports").json()["items"] == []
