"""Token secrets appear in no log line, no error message and no answer but the one that
created them, through a busy scenario: tokens made, used, refused, revoked.

(conftest also searches every log line of the whole run for every secret the tests made.)
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.logging import JsonFormatter
from app.scheduler.runtime import Runtime
from tests.builders import (
    issue_token,
    make_executor,
    place_checkpoint,
    remember_secret,
    token_client,
)


def test_secrets_never_leak(
    auth_app: FastAPI, auth_client: TestClient, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger at every level, SQL statements included
    answers: list[httpx.Response] = []
    creations: list[httpx.Response] = []

    def ask(secret: str | None, method: str, path: str, **kwargs: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
        response: httpx.Response = auth_client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        answers.append(response)
        return response

    _, admin = issue_token(auth_app, name="admin", scopes=("admin",))
    secrets: dict[str, str] = {}
    for name, scopes, projects in (
        ("trainer", ["register"], ["llama"]),
        ("reader", ["read"], ["llama"]),
        ("ops", ["admin"], None),
    ):
        response = auth_client.post(
            "/v1/tokens",
            json={"name": name, "scopes": scopes, "projects": projects},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert response.status_code == 201, response.text
        creations.append(response)
        secrets[name] = remember_secret(response.json()["token"])
    everything = [admin, *secrets.values()]

    # used as meant
    run = ask(secrets["trainer"], "POST", "/v1/runs", json={"project": "llama", "name": "r"})
    trainer = token_client(auth_app, secrets["trainer"])
    for step in (1, 2, 3, 4):
        place_checkpoint(trainer, data_dir, run.json(), step)
    ask(secrets["reader"], "GET", "/v1/runs")
    ask(secrets["reader"], "POST", "/v1/plan", json={})
    ask(
        secrets["ops"],
        "PUT",
        "/v1/policies/thin",
        json={
            "name": "thin",
            "rules": [{"name": "k", "class": "rolling", "keep_last": 1, "action": "delete"}],
        },
    )
    ask(secrets["ops"], "POST", "/v1/sweeps", json={})
    ask(secrets["ops"], "GET", "/v1/tokens", params={"include_revoked": True})
    # refused: wrong scope, wrong project, bad and mangled credentials
    ask(secrets["reader"], "POST", "/v1/runs", json={"project": "llama", "name": "x"})
    ask(secrets["trainer"], "POST", "/v1/runs", json={"project": "other", "name": "x"})
    ask(secrets["trainer"], "DELETE", "/v1/tokens/tok_nothing")
    ask(secrets["ops"], "DELETE", "/v1/tokens/tok_nothing")
    for secret in everything:
        for header in (f"Basic {secret}", f"Token {secret}", f"Bearer {secret} {secret}"):
            response = auth_client.get("/v1/runs", headers={"Authorization": header})
            answers.append(response)
        ask(secret + "x", "GET", "/v1/runs")
        ask(secret[:-1], "GET", "/v1/tiers")
    # revoked, then tried again
    listed = ask(admin, "GET", "/v1/tokens").json()["items"]
    for token in listed:
        if token["name"] in secrets:
            ask(admin, "DELETE", f"/v1/tokens/{token['id']}")
    for secret in secrets.values():
        assert ask(secret, "GET", "/v1/runs").status_code == 401
    # background work logs too
    make_executor(auth_app, trash_retention=timedelta(0)).drain()
    Runtime(
        auth_app.state.session_factory,
        auth_app.state.tiers,
        sweep_interval=timedelta(minutes=5),
        trash_retention=timedelta(0),
        worker=False,
        scheduler=False,
        evaluator=False,
    ).sweep()

    statuses = {r.status_code for r in answers}
    assert {200, 201, 202, 204, 401, 403, 404} <= statuses
    formatter = JsonFormatter()
    lines = [formatter.format(record) for record in caplog.records] + [caplog.text]
    assert any("token created" in line for line in lines)
    for secret in everything:
        leaks = [line for line in lines if secret in line]
        assert leaks == [], "a secret in the logs"
        for response in answers:
            assert secret not in response.text, (response.request.url, response.status_code)
            assert secret not in str(response.headers), response.request.url
    for response in creations:
        others = [s for s in everything if s != response.json()["token"]]
        assert not any(s in response.text for s in others)
