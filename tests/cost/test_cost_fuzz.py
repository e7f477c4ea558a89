"""Bad input at scale on the cost routes: schemathesis sends each of them generated
requests, valid and invalid. No answer may be a 5xx; every 4xx is a problem document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.schemas import BaseSchema
from sqlalchemy import Engine

from app.settings import Settings
from tests.builders import PROBLEM_JSON
from tests.cost.conftest import cost_app

OPERATIONS = [("GET", "/v1/reports/cost"), ("POST", "/v1/forecast"), ("POST", "/v1/planner")]


@pytest.fixture
def fuzzed_app(settings: Settings, clean_engine: Engine) -> Iterator[FastAPI]:
    app = cost_app(settings, clean_engine)
    with TestClient(app):
        yield app


def problem_for_4xx(_ctx: Any, response: Any, case: Case[Any]) -> bool | None:
    if not 400 <= response.status_code < 500:
        return None
    media = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    assert media == PROBLEM_JSON, f"{case.method} {case.formatted_path}: {media!r}"
    body = json.loads(response.content)
    assert body.get("status") == response.status_code and body.get("detail"), body
    return True


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_server_error_and_every_refusal_is_a_problem(
    fuzzed_app: FastAPI, method: str, path: str
) -> None:
    schema: BaseSchema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    operation = schema[path][method]
    requests = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=requests)
    def answers(case: Case[Any]) -> None:
        case.call_and_validate(checks=[not_a_server_error, problem_for_4xx])

    answers()
