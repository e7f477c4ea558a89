"""Bad input at scale: schemathesis sends every operation of the service's own OpenAPI
document generated requests, valid ones and invalid ones (wrong types, missing and unknown
fields, out-of-range values, odd strings). No answer may be a 5xx, and every 4xx must be
a problem document (`application/problem+json`) that says what went wrong.

One app on SQLite with access control off, so every route is reached past the token
check; the examples per operation are few, so the whole file stays well under a minute.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import not_a_server_error
from schemathesis.schemas import BaseSchema
from sqlalchemy import Engine

from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import PROBLEM_JSON, assert_problem

MAX_EXAMPLES = 6


def operations() -> list[tuple[str, str]]:
    """(method, path) of every operation in the OpenAPI document of a freshly built app."""
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        settings = Settings(
            database_url=f"sqlite:///{root / 'schema.db'}",
            data_dir=root / "data",
            policies_dir=root / "policies",
        )
        app = create_app(settings, roles=NO_BACKGROUND)
        document = app.openapi()
        app.state.engine.dispose()
    return sorted(
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "put", "post", "patch", "delete")
    )


OPERATIONS = operations()


@pytest.fixture(scope="module")
def api_schema(
    database_url: str, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> BaseSchema:
    """The OpenAPI document of one app for the whole module, read from the app itself
    (schemathesis runs the app's startup, and calls it in process)."""
    root = tmp_path_factory.mktemp("schemathesis")
    settings = Settings(
        database_url=database_url,
        data_dir=root / "data",
        policies_dir=root / "policies",
        auth="off",
    )
    app = create_app(settings, engine=engine, roles=NO_BACKGROUND)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def problem_document_for_4xx(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """A 4xx is application/problem+json with its status, a title and a detail."""
    if not 400 <= response.status_code < 500:
        return None
    media = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    assert media == PROBLEM_JSON, (
        f"{case.method} {case.formatted_path} answered {response.status_code} as {media!r}"
    )
    body = json.loads(response.content)
    assert isinstance(body, dict) and body.get("status") == response.status_code, body
    assert body.get("title") and body.get("detail"), body
    return True


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_request_gets_a_server_error_and_every_refusal_is_a_problem(
    api_schema: BaseSchema, method: str, path: str
) -> None:
    operation = api_schema[path][method]
    # Valid and invalid requests mixed; an operation with nothing that can be invalid (only
    # free-form strings) draws valid ones only.
    requests = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=requests)
    def answers(case: Case[Any]) -> None:
        case.call_and_validate(checks=[not_a_server_error, problem_document_for_4xx])

    answers()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_deeply_nested_json_policy_is_refused(client: TestClient) -> None:
    response = client.put(
        "/v1/policies/deep",
        content="[" * 5000 + "]" * 5000,
        headers={"content-type": "application/json"},
    )
    assert response.status_code in (400, 422), response.text
    assert_problem(response, response.status_code, "body")
