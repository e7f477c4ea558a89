"""The authorization matrix: every route of the app x every kind of caller x a resource of
the caller's own project and of another project.

The routes come from the app's own route table, and the expectations from SPEC below,
written from DESIGN section 11 independently of the app's rule table: a new route fails
here until both say who may call it.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from app.api.auth import RULES, ProjectFrom
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import (
    PROBLEM_JSON,
    assert_problem,
    issue_token,
    place_checkpoint,
    remember_secret,
    token_client,
)

# (least scope, which projects the route touches): "one" project, which a bounded token
# must own; "all" of them, which only a token bounded by none may see; or "none" (lists
# are filtered instead: test_project_bounds.py). Scope None: open to everyone.
SPEC: dict[tuple[str, str], tuple[str | None, str]] = {
    ("GET", "/healthz"): (None, "none"),
    # the console: its pages are open; what they show is what the caller's token reads
    ("GET", "/"): (None, "none"),
    ("GET", "/console"): (None, "none"),
    ("GET", "/console/"): (None, "none"),
    ("GET", "/console/{asset:path}"): (None, "none"),
    ("POST", "/v1/runs"): ("register", "one"),
    ("GET", "/v1/runs"): ("read", "none"),
    ("GET", "/v1/runs/{run_id}"): ("read", "one"),
    ("PATCH", "/v1/runs/{run_id}"): ("register", "one"),
    ("POST", "/v1/runs/{run_id}/checkpoints"): ("register", "one"),
    ("GET", "/v1/runs/{run_id}/checkpoints"): ("read", "one"),
    ("GET", "/v1/checkpoints/{checkpoint_id}"): ("read", "one"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/commit"): ("register", "one"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/keepalive"): ("register", "one"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/abort"): ("register", "one"),
    ("PATCH", "/v1/checkpoints/{checkpoint_id}"): ("register", "one"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/pin"): ("admin", "none"),
    ("DELETE", "/v1/checkpoints/{checkpoint_id}/pin"): ("admin", "none"),
    ("DELETE", "/v1/checkpoints/{checkpoint_id}"): ("admin", "none"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/undelete"): ("admin", "none"),
    ("POST", "/v1/checkpoints/{checkpoint_id}/restore"): ("admin", "none"),
    ("POST", "/v1/plan"): ("read", "one"),
    ("POST", "/v1/sweeps"): ("admin", "none"),
    ("POST", "/v1/sweeps/{sweep_id}/approve"): ("admin", "none"),
    ("GET", "/v1/actions"): ("read", "none"),
    ("GET", "/v1/actions/{action_id}"): ("read", "one"),
    ("POST", "/v1/actions/{action_id}/approve"): ("admin", "none"),
    ("GET", "/v1/policies"): ("read", "none"),
    ("GET", "/v1/policies/{name}"): ("read", "none"),
    ("PUT", "/v1/policies/{name}"): ("admin", "none"),
    ("DELETE", "/v1/policies/{name}"): ("admin", "none"),
    ("GET", "/v1/policies/{name}/shadow"): ("read", "none"),
    ("GET", "/v1/tiers"): ("read", "none"),
    ("POST", "/v1/tokens"): ("admin", "none"),
    ("GET", "/v1/tokens"): ("admin", "none"),
    ("DELETE", "/v1/tokens/{token_id}"): ("admin", "none"),
    # contract routes not built yet: here so they are checked the day they land
    ("GET", "/v1/reports/cost"): ("read", "none"),
    ("POST", "/v1/forecast"): ("read", "none"),
    ("POST", "/v1/backtest"): ("read", "one"),
    ("POST", "/v1/planner"): ("read", "none"),
    ("GET", "/v1/reconcile"): ("admin", "none"),
    ("POST", "/v1/reconcile/orphans/delete"): ("admin", "none"),
    ("GET", "/v1/audit"): ("admin", "none"),
    ("POST", "/v1/imports"): ("admin", "none"),
    ("GET", "/v1/imports"): ("admin", "none"),
    ("GET", "/v1/imports/{import_id}"): ("admin", "none"),
    ("GET", "/metrics"): ("read", "all"),
}
UNDOCUMENTED = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
RANK = {"read": 0, "register": 1, "admin": 2}

# caller -> (scopes, projects) of its token; "none" sends no token, "unknown" a made-up one
CALLERS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None] | None] = {
    "none": None,
    "unknown": None,
    "read": (("read",), ("own",)),
    "register": (("register",), ("own",)),
    "read-all": (("read",), ("*",)),
    "admin": (("admin",), None),
}
SIDES = ("own", "other")


def app_routes() -> list[tuple[str, str]]:
    """(method, path) of every API route of a freshly built app."""
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        settings = Settings(
            database_url=f"sqlite:///{root / 'routes.db'}",
            data_dir=root / "data",
            policies_dir=root / "policies",
        )
        app = create_app(settings, roles=NO_BACKGROUND)
        routes = sorted(
            (method, str(context.path))
            for context in iter_route_contexts(app.routes)
            if context.path not in UNDOCUMENTED
            for method in context.methods or ()
        )
        assert all(
            isinstance(context.original_route, APIRoute)
            for context in iter_route_contexts(app.routes)
            if context.path not in UNDOCUMENTED
        ), "a route the rule table cannot see"
        app.state.engine.dispose()
    return routes


ROUTES = app_routes()


def test_every_route_has_a_rule_and_an_expectation() -> None:
    missing_rules = [r for r in ROUTES if r not in RULES]
    missing_spec = [r for r in ROUTES if r not in SPEC]
    assert missing_rules == [], "routes without an access rule in app/api/auth.py"
    assert missing_spec == [], "routes without an expectation in this test's SPEC"


def test_rule_table_agrees_with_the_spec() -> None:
    """Both tables say the same of every route, built or still to come."""
    assert set(RULES) == set(SPEC)
    for key, rule in RULES.items():
        scope, touches = SPEC[key]
        assert rule.scope == scope, key
        if rule.scope != "admin":  # admin tokens are bounded by no project
            kind = {ProjectFrom.NONE: "none", ProjectFrom.LISTED: "none", ProjectFrom.ALL: "all"}
            assert kind.get(rule.project, "one") == touches, key


def test_path_rules_name_a_parameter_of_their_route() -> None:
    params = {
        ProjectFrom.RUN: "{run_id}",
        ProjectFrom.CHECKPOINT: "{checkpoint_id}",
        ProjectFrom.ACTION: "{action_id}",
    }
    for (_method, path), rule in RULES.items():
        if rule.project in params:
            assert params[rule.project] in path, path


@dataclass
class World:
    """Two projects, each with a run, a checkpoint and an action; tokens of each kind."""

    app: FastAPI
    secrets: dict[str, str | None]
    params: dict[str, dict[str, str]]  # side -> path parameter -> value
    projects: dict[str, str]  # side -> project name
    data_dir: Path

    def client(self, caller: str) -> TestClient:
        return token_client(self.app, self.secrets[caller])


POLICY = {
    "name": "matrix",
    "rules": [{"name": "keep", "class": "rolling", "keep_last": 3, "action": "delete"}],
}


@pytest.fixture
def world(auth_app: FastAPI, auth_client: TestClient, data_dir: Path) -> Iterator[World]:
    secrets: dict[str, str | None] = {"none": None, "unknown": "ckpt_" + "x" * 43}
    for caller, grant in CALLERS.items():
        if grant is not None:
            scopes, projects = grant
            bound = tuple(p if p == "*" else f"proj-{p}" for p in projects) if projects else None
            secrets[caller] = issue_token(auth_app, name=caller, scopes=scopes, projects=bound)[1]
    admin = token_client(auth_app, secrets["admin"])
    assert admin.put("/v1/policies/matrix", json=POLICY).status_code == 200
    sweep = admin.post("/v1/sweeps", json={})
    assert sweep.status_code == 202, sweep.text
    params: dict[str, dict[str, str]] = {}
    project_of: dict[str, str] = {}
    for side in SIDES:
        project = f"proj-{side}"
        run = admin.post("/v1/runs", json={"project": project, "name": "run-1"}).json()
        checkpoint = place_checkpoint(admin, data_dir, run, 1)
        action = admin.post(
            f"/v1/checkpoints/{checkpoint['id']}/restore", json={"tier": "warm"}
        ).json()
        victim_id, _ = issue_token(
            auth_app, name=f"victim-{side}", scopes=("read",), projects=("*",)
        )
        project_of[side] = project
        adoption = admin.post(
            "/v1/imports",
            json={"uri": _tree(data_dir, project), "project": project, "dry_run": True},
        )
        assert adoption.status_code == 202, adoption.text
        params[side] = {
            "import_id": adoption.json()["id"],
            "run_id": run["id"],
            "checkpoint_id": checkpoint["id"],
            "action_id": action["id"],
            "sweep_id": sweep.json()["id"],
            "name": "matrix",
            "token_id": victim_id,
            "asset": "js/app.js",  # a file of the console
        }
    yield World(auth_app, secrets, params, project_of, data_dir)


BodyMaker = Callable[[World, str], Any]


def _tree(data_dir: Path, project: str) -> str:
    return f"file://{(data_dir / 'hot' / project).resolve()}"


# Request bodies the routes accept; a route without one is called without a body (an
# allowed caller may then get a 422, which is still "allowed": not 401 nor 403).
BODIES: dict[tuple[str, str], BodyMaker] = {
    ("POST", "/v1/runs"): lambda w, side: {"project": w.projects[side], "name": "matrix"},
    ("PATCH", "/v1/runs/{run_id}"): lambda w, side: {"labels": {"matrix": side}},
    ("POST", "/v1/runs/{run_id}/checkpoints"): lambda w, side: {
        "step": 99,
        "class": "rolling",
        "uri": f"file://{(w.data_dir / 'hot' / w.projects[side] / 'run-1' / 'step-99').resolve()}",
        "committed": False,
    },
    ("POST", "/v1/checkpoints/{checkpoint_id}/commit"): lambda w, side: {},
    ("POST", "/v1/checkpoints/{checkpoint_id}/abort"): lambda w, side: {"reason": "matrix"},
    ("PATCH", "/v1/checkpoints/{checkpoint_id}"): lambda w, side: {"labels": {"matrix": side}},
    ("POST", "/v1/checkpoints/{checkpoint_id}/pin"): lambda w, side: {"reason": "matrix"},
    ("POST", "/v1/checkpoints/{checkpoint_id}/restore"): lambda w, side: {"tier": "cold"},
    ("POST", "/v1/plan"): lambda w, side: {"project": w.projects[side]},
    ("POST", "/v1/backtest"): lambda w, side: {
        "project": w.projects[side],
        "policy": {"name": "matrix", "rules": []},
    },
    ("POST", "/v1/imports"): lambda w, side: {
        "uri": _tree(w.data_dir, w.projects[side]),
        "project": w.projects[side],
        "dry_run": True,
    },
    ("POST", "/v1/sweeps"): lambda w, side: {"project": w.projects[side]},
    ("PUT", "/v1/policies/{name}"): lambda w, side: POLICY,
    ("POST", "/v1/tokens"): lambda w, side: {
        "name": f"made-{side}",
        "scopes": ["read"],
        "projects": [w.projects[side]],
    },
}


def expected(method: str, path: str, caller: str, side: str) -> int | None:
    """401, 403, or None for allowed (any answer but those two)."""
    scope, touches = SPEC[method, path]
    if scope is None:
        return None
    if caller in ("none", "unknown"):
        return 401
    caller_scopes = CALLERS[caller]
    assert caller_scopes is not None
    if max(RANK[s] for s in caller_scopes[0]) < RANK[scope]:
        return 403
    bounded = caller_scopes[1] not in (None, ("*",))
    if bounded and (touches == "all" or (touches == "one" and side == "other")):
        return 403
    return None


def concrete(path: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            pytest.fail(f"no sample value for path parameter {{{name}}}: add one to World")
        return values[name]

    return re.sub(r"\{(\w+)(?::\w+)?\}", value, path)  # {asset:path} too


def call(world: World, caller: str, method: str, path: str, side: str) -> httpx.Response:
    body = BODIES.get((method, path))
    response: httpx.Response = world.client(caller).request(
        method,
        concrete(path, world.params[side]),
        json=body(world, side) if body is not None else None,
    )
    if response.status_code == 201 and path == "/v1/tokens":
        remember_secret(response.json()["token"])
    return response


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_authorization_matrix(world: World, method: str, path: str) -> None:
    if (method, path) not in SPEC:
        pytest.fail(f"{method} {path} has no expectation in SPEC: say who may call it")
    failures = []
    for caller in CALLERS:  # admin last: what it deletes, the others have already tried
        for side in SIDES:
            response = call(world, caller, method, path, side)
            want = expected(method, path, caller, side)
            got = response.status_code
            if want is None and got in (401, 403):
                failures.append(f"{caller}/{side}: {got}, expected allowed: {response.text}")
            elif want is not None and got != want:
                failures.append(f"{caller}/{side}: {got}, expected {want}: {response.text}")
            elif want is not None:
                assert response.headers["content-type"].startswith(PROBLEM_JSON)
                if want == 401:
                    assert response.headers["www-authenticate"].startswith("Bearer")
    assert failures == []


def test_a_route_without_a_rule_is_refused_even_to_admin(
    auth_app: FastAPI, auth_client: TestClient, admin_secret: str
) -> None:
    @auth_app.get("/v1/unruled")
    def unruled() -> dict[str, str]:
        return {"status": "should never answer"}

    response = token_client(auth_app, admin_secret).get("/v1/unruled")
    assert response.status_code == 403
    assert "rule" in response.json()["detail"]


def test_a_route_without_a_rule_is_refused_with_auth_off(app: FastAPI, client: TestClient) -> None:
    @app.get("/v1/unruled")
    def unruled() -> dict[str, str]:
        return {"status": "should never answer"}

    assert client.get("/v1/unruled").status_code == 403
    assert client.get("/v1/tiers").status_code == 200


def test_a_caller_without_the_right_token_never_learns_what_is_wrong_with_its_body(
    auth_app: FastAPI, auth_client: TestClient, admin_client: TestClient
) -> None:
    """FastAPI parses a body before it runs the authorization dependency; the refusal comes
    first all the same: 401 without a token, 403 without the scope, and only a caller who may
    make the request hears about its malformed or invalid body."""
    _, reader = issue_token(auth_app, name="reader", scopes=("read",), projects=("*",))
    as_reader = token_client(auth_app, reader)
    bad_bodies = [
        ("POST", "/v1/runs", b"{not json"),
        ("POST", "/v1/runs", b'{"project": "Not A Name!", "name": 5}'),
        ("POST", "/v1/tokens", b'{"name": []}'),
        ("POST", "/v1/sweeps", b"[[["),
    ]
    for method, path, body in bad_bodies:
        headers = {"content-type": "application/json"}
        assert_problem(auth_client.request(method, path, content=body, headers=headers), 401)
        assert_problem(as_reader.request(method, path, content=body, headers=headers), 403)
        allowed = admin_client.request(method, path, content=body, headers=headers)
        assert allowed.status_code in (400, 422), (method, path, allowed.text)
    # a bad query parameter too
    assert_problem(auth_client.get("/v1/audit", params={"since": "yesterday"}), 401)
    assert_problem(as_reader.get("/v1/audit", params={"since": "yesterday"}), 403)
    assert_problem(admin_client.get("/v1/audit", params={"since": "yesterday"}), 422, "since")
