"""The OpenAPI document against the behaviour: schemathesis sends every operation of the
service's own document generated requests, valid ones and invalid ones (wrong types,
missing and unknown fields, out-of-range values, odd strings), with every check it has on:
no 5xx, every status and media type and body as documented, valid input accepted, invalid
input refused. Any failure of any check fails the test. Every 4xx is also a problem
document (`application/problem+json`) that says what went wrong.

As deployed: PostgreSQL, access control on, an admin token. The examples per operation
are few enough that the whole file stays near a minute on two cores.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.schemas import BaseSchema
from sqlalchemy import Engine

from app.db.pagination import encode_cursor
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import PROBLEM_JSON, assert_problem, bearer, remember_secret

MAX_EXAMPLES = 40
ADMIN_SECRET = remember_secret("schemathesis-admin-" + "s" * 24)


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

# A cursor is opaque: the document names its kind (app.api.openapi), and here is how to make
# one of each kind, as a list would hand it out.
schemathesis.openapi.format("ckpt-cursor-number", st.integers(0, 2**62).map(encode_cursor))
schemathesis.openapi.format("ckpt-cursor-id", st.text(max_size=40).map(encode_cursor))


@pytest.fixture(scope="module")
def served(
    database_url: str, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FastAPI]:
    """One app for the whole module, as deployed: access control on, an admin token."""
    root = tmp_path_factory.mktemp("schemathesis")
    settings = Settings(
        database_url=database_url,
        data_dir=root / "data",
        policies_dir=root / "policies",
        auth="on",
        bootstrap_token=SecretStr(ADMIN_SECRET),
    )
    app = create_app(settings, engine=engine, roles=NO_BACKGROUND)
    with TestClient(app):  # the lifespan seeds the admin token
        yield app


@pytest.fixture(scope="module")
def api_schema(served: FastAPI) -> BaseSchema:
    """The OpenAPI document read from the app itself, called in process."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", served)
    # Every request carries the admin token (below); none is drawn in its place.
    schema.config.generation.with_security_parameters = False

    @schema.hook
    def filter_body(ctx: Any, body: Any) -> bool:
        """Rule names are unique within a policy: the document says so in words, as JSON
        Schema cannot, so no generator keeps to it by itself."""
        rules = body.get("rules") if isinstance(body, dict) else None
        if not isinstance(rules, list):
            return True
        names = [r.get("name") for r in rules if isinstance(r, dict)]
        return len(names) == len(set(names))

    @schema.hook
    def filter_case(ctx: Any, case: Case[Any]) -> bool:
        """The generator draws integers near a 64-bit bound as doubles, 2,048 apart there:
        a "valid" step of 2^63 + 191 is past the documented maximum, not valid data."""
        if case.meta is None or not case.meta.generation.mode.is_positive:
            return True
        return not any(beyond_int64(part) for part in (case.body, case.query))

    return schema


def beyond_int64(node: Any) -> bool:
    if isinstance(node, bool):
        return False
    if isinstance(node, int):
        return not -(2**63) <= node < 2**63
    if isinstance(node, dict):
        return any(beyond_int64(v) for v in node.values())
    if isinstance(node, list):
        return any(beyond_int64(v) for v in node)
    return False


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


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_check_passes_on_every_operation(
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
        # No `checks=`: every check schemathesis has, as `--checks all` runs them.
        case.call_and_validate(
            headers=bearer(ADMIN_SECRET), additional_checks=[problem_document_for_4xx]
        )

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
