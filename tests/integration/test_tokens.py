"""API tokens: a secret shown once and stored hashed, revocation on the next request, 401
for every kind of bad credentials, and the bootstrap token."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, select, text

from app.bootstrap import bootstrap_token
from app.db.models import Token
from app.db.session import session_scope
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import assert_problem, bearer, remember_secret, token_client

BOOTSTRAP = remember_secret("bootstrap-secret-for-tests-0123456789")


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/tokens", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    remember_secret(created["token"])
    return created


def test_created_secret_is_shown_once_and_stored_only_as_its_hash(
    admin_client: TestClient, clean_engine: Engine
) -> None:
    response = admin_client.post(
        "/v1/tokens", json={"name": "trainer", "scopes": ["register"], "projects": ["llama"]}
    )
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    secret = remember_secret(body["token"])
    assert secret.startswith("ckpt_") and len(secret) >= 40
    assert body["id"].startswith("tok_")
    assert body["scopes"] == ["register"] and body["projects"] == ["llama"]
    assert body["created_by"].startswith("token:") and body["revoked_at"] is None
    with clean_engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM tokens")).all()
    stored = " ".join(str(value) for row in rows for value in row)
    assert secret not in stored
    assert secret.removeprefix("ckpt_") not in stored
    assert hashlib.sha256(secret.encode()).hexdigest() in stored


def test_list_shows_tokens_without_any_secret(admin_client: TestClient) -> None:
    made = create(admin_client, name="reader", scopes=["read"], projects=["*"])
    response = admin_client.get("/v1/tokens")
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert made["id"] in {t["id"] for t in items}
    assert made["token"] not in response.text
    for item in items:
        assert set(item) == {
            "id",
            "name",
            "scopes",
            "projects",
            "created_at",
            "created_by",
            "revoked_at",
            "revoked_by",
        }


def test_new_token_works_and_revocation_takes_effect_on_the_next_request(
    auth_app: FastAPI, admin_client: TestClient
) -> None:
    made = create(admin_client, name="reader", scopes=["read"], projects=["*"])
    reader = token_client(auth_app, made["token"])
    assert reader.get("/v1/runs").status_code == 200
    revoked = admin_client.delete(f"/v1/tokens/{made['id']}")
    assert revoked.status_code == 204, revoked.text
    body = assert_problem(reader.get("/v1/runs"), 401)
    assert made["token"] not in str(body)
    listed = admin_client.get("/v1/tokens").json()["items"]
    assert made["id"] not in {t["id"] for t in listed}
    everything = admin_client.get("/v1/tokens", params={"include_revoked": True}).json()
    [row] = [t for t in everything["items"] if t["id"] == made["id"]]
    assert row["revoked_at"] is not None and row["revoked_by"].startswith("token:")


def test_revoking_twice_is_harmless_and_an_unknown_token_is_404(
    admin_client: TestClient,
) -> None:
    made = create(admin_client, name="reader", scopes=["read"], projects=["*"])
    assert admin_client.delete(f"/v1/tokens/{made['id']}").status_code == 204
    assert admin_client.delete(f"/v1/tokens/{made['id']}").status_code == 204
    assert_problem(admin_client.delete("/v1/tokens/tok_nothing"), 404)


@pytest.mark.parametrize(
    ("header", "invalid"),
    [
        (None, False),
        ("", True),
        ("Bearer", True),
        ("Bearer ", True),
        ("Basic dXNlcjpwYXNz", True),
        ("Bearer two words", True),
        ("Bearer ckpt_not-a-token-anyone-made", True),
        ("bearer ckpt_lowercase-scheme-is-fine-but-unknown", True),
    ],
)
def test_bad_credentials_get_401_problem_with_a_challenge(
    auth_client: TestClient, header: str | None, invalid: bool
) -> None:
    headers = {"Authorization": header} if header is not None else {}
    response = auth_client.get("/v1/runs", headers=headers)
    body = assert_problem(response, 401)
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer")
    assert ('error="invalid_token"' in challenge) == invalid
    if header:
        secret = header.partition(" ")[2]
        assert not secret or secret not in response.text, body


def test_revoked_token_gets_401(auth_app: FastAPI, admin_client: TestClient) -> None:
    made = create(admin_client, name="soon-gone", scopes=["admin"])
    assert admin_client.delete(f"/v1/tokens/{made['id']}").status_code == 204
    response = token_client(auth_app, made["token"]).get("/v1/tiers")
    assert_problem(response, 401)
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_wrong_scope_gets_403_naming_the_scope(auth_app: FastAPI, admin_client: TestClient) -> None:
    made = create(admin_client, name="reader", scopes=["read"], projects=["*"])
    response = token_client(auth_app, made["token"]).post("/v1/sweeps", json={})
    body = assert_problem(response, 403)
    assert "admin" in body["detail"]
    assert 'scope="admin"' in response.headers["www-authenticate"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "scopes": [], "projects": ["*"]}, "scopes"),
        ({"name": "x", "scopes": ["write"], "projects": ["*"]}, "scopes"),
        ({"name": "x", "scopes": ["read"]}, "projects"),
        ({"name": "x", "scopes": ["read"], "projects": []}, "projects"),
        ({"name": "x", "scopes": ["read"], "projects": ["*", "llama"]}, "projects"),
        ({"name": "x", "scopes": ["read"], "projects": ["Not A Name"]}, "projects"),
        ({"name": "x", "scopes": ["admin"], "projects": ["llama"]}, "projects"),
        ({"name": "Bad Name", "scopes": ["read"], "projects": ["*"]}, "name"),
        ({"scopes": ["read"], "projects": ["*"]}, "name"),
        ({"name": "x", "scopes": ["read"], "projects": ["*"], "token": "mine"}, "token"),
    ],
)
def test_bad_token_requests_are_refused_naming_the_field(
    admin_client: TestClient, body: dict[str, Any], field: str
) -> None:
    assert_problem(admin_client.post("/v1/tokens", json=body), 422, field)


def test_admin_token_needs_no_project_list(admin_client: TestClient) -> None:
    made = create(admin_client, name="ops", scopes=["admin", "read"])
    assert made["projects"] == ["*"]
    assert made["scopes"] == ["admin", "read"]


# --- bootstrap and the quick start ------------------------------------------------------------


def bootstrapped(settings: Settings, engine: Engine) -> FastAPI:
    return create_app(
        settings.model_copy(update={"bootstrap_token": SecretStr(BOOTSTRAP)}),
        engine=engine,
        roles=NO_BACKGROUND,
    )


def bootstrap_rows(engine: Engine) -> list[str]:
    digest = hashlib.sha256(BOOTSTRAP.encode()).hexdigest()
    with engine.connect() as connection:
        rows = connection.execute(select(Token.id).where(Token.secret_hash == digest))
        return list(rows.scalars())


def test_bootstrap_token_is_created_once_across_starts(
    auth_settings: Settings, clean_engine: Engine
) -> None:
    for _start in range(2):
        app = bootstrapped(auth_settings, clean_engine)
        with TestClient(app) as client:
            response = client.get("/v1/tokens", headers=bearer(BOOTSTRAP))
            assert response.status_code == 200, response.text
            names = [t["name"] for t in response.json()["items"]]
            assert names == ["bootstrap"]
            assert response.json()["items"][0]["created_by"] == "system:bootstrap"
    assert len(bootstrap_rows(clean_engine)) == 1


def test_a_revoked_bootstrap_token_stays_revoked_after_a_restart(
    auth_settings: Settings, clean_engine: Engine
) -> None:
    with TestClient(bootstrapped(auth_settings, clean_engine)) as client:
        [token] = client.get("/v1/tokens", headers=bearer(BOOTSTRAP)).json()["items"]
        revoked = client.delete(f"/v1/tokens/{token['id']}", headers=bearer(BOOTSTRAP))
        assert revoked.status_code == 204, revoked.text
    with TestClient(bootstrapped(auth_settings, clean_engine)) as client:
        assert_problem(client.get("/v1/tokens", headers=bearer(BOOTSTRAP)), 401)
    assert len(bootstrap_rows(clean_engine)) == 1


def test_replicas_starting_together_create_one_bootstrap_token(
    auth_settings: Settings, clean_engine: Engine
) -> None:
    app = bootstrapped(auth_settings, clean_engine)
    settings = app.state.settings
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: bootstrap_token(app.state.session_factory, settings), range(16)))
    assert len(bootstrap_rows(clean_engine)) == 1
    with session_scope(app.state.session_factory) as session:
        assert session.execute(select(Token.name)).scalars().all() == ["bootstrap"]


def test_auth_off_lets_everyone_in_as_anonymous(client: TestClient) -> None:
    response = client.post("/v1/runs", json={"project": "quick", "name": "start"})
    assert response.status_code == 201, response.text
    assert response.json()["created_by"] == "anonymous"
    assert client.get("/v1/tokens").status_code == 200


def test_liveness_and_the_api_documentation_need_no_token(auth_client: TestClient) -> None:
    assert auth_client.get("/healthz").status_code == 200
    assert auth_client.get("/openapi.json").status_code == 200
    assert auth_client.get("/docs").status_code == 200
