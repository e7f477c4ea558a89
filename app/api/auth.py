"""Access control (section 11): one dependency, installed on the whole app, checks every
request against a declarative table keyed by (method, route path template).

A rule names the least scope a route needs and where the project it touches comes from.
A route missing from the table is refused for everyone, so a new route cannot ship open
by accident (the authorization matrix test fails for it too). Rules for contract routes
that are not built yet are already here, so they are guarded the day they land.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

import anyio
from fastapi import Request
from fastapi.routing import APIRoute, iter_route_contexts
from sqlalchemy import Engine
from starlette.routing import BaseRoute

from app.domain.access import ANONYMOUS, NOBODY, Principal, Scope
from app.domain.errors import Forbidden, Unauthorized
from app.services.catalog.tokens import ProjectOf, TokenMatch, lookup_token

log = logging.getLogger("app.auth")


class ProjectFrom(Enum):
    """Where the project a request touches is found. A bounded (`read`/`register` with a
    project list) token may only touch its own projects; admin tokens are never bounded."""

    NONE = "none"  # project-less: policies, tiers' configuration, tokens, forecasts
    LISTED = "listed"  # a list: the route filters it to the caller's projects
    RUN = "run"  # path parameter run_id
    CHECKPOINT = "checkpoint"  # path parameter checkpoint_id
    ACTION = "action"  # path parameter action_id
    BODY = "body"  # JSON body: `project`, else `run_id`; neither: filtered like a list
    ALL = "all"  # every project at once, unfiltered: only for a token bounded by none


@dataclass(frozen=True, slots=True)
class Rule:
    scope: Scope | None  # None: open to every caller, no token needed
    project: ProjectFrom = ProjectFrom.NONE


OPEN = Rule(None)
ADMIN = Rule("admin")
READ = Rule("read")

RULES: Mapping[tuple[str, str], Rule] = MappingProxyType(
    {
        ("GET", "/healthz"): OPEN,
        # the console's pages and assets: what they show is what the caller's token reads
        ("GET", "/"): OPEN,
        ("GET", "/console"): OPEN,
        ("GET", "/console/"): OPEN,
        ("GET", "/console/{asset:path}"): OPEN,
        # runs and checkpoints: what a training job does with a `register` token
        ("POST", "/v1/runs"): Rule("register", ProjectFrom.BODY),
        ("GET", "/v1/runs"): Rule("read", ProjectFrom.LISTED),
        ("GET", "/v1/runs/{run_id}"): Rule("read", ProjectFrom.RUN),
        ("PATCH", "/v1/runs/{run_id}"): Rule("register", ProjectFrom.RUN),
        ("POST", "/v1/runs/{run_id}/checkpoints"): Rule("register", ProjectFrom.RUN),
        ("GET", "/v1/runs/{run_id}/checkpoints"): Rule("read", ProjectFrom.RUN),
        ("GET", "/v1/checkpoints/{checkpoint_id}"): Rule("read", ProjectFrom.CHECKPOINT),
        ("POST", "/v1/checkpoints/{checkpoint_id}/commit"): Rule(
            "register", ProjectFrom.CHECKPOINT
        ),
        ("POST", "/v1/checkpoints/{checkpoint_id}/keepalive"): Rule(
            "register", ProjectFrom.CHECKPOINT
        ),
        ("POST", "/v1/checkpoints/{checkpoint_id}/abort"): Rule("register", ProjectFrom.CHECKPOINT),
        ("PATCH", "/v1/checkpoints/{checkpoint_id}"): Rule("register", ProjectFrom.CHECKPOINT),
        # what only an admin does to checkpoints
        ("POST", "/v1/checkpoints/{checkpoint_id}/pin"): ADMIN,
        ("DELETE", "/v1/checkpoints/{checkpoint_id}/pin"): ADMIN,
        ("DELETE", "/v1/checkpoints/{checkpoint_id}"): ADMIN,
        ("POST", "/v1/checkpoints/{checkpoint_id}/undelete"): ADMIN,
        ("POST", "/v1/checkpoints/{checkpoint_id}/restore"): ADMIN,
        # plans are dry runs: readable; sweeps and approvals write to the ledger
        ("POST", "/v1/plan"): Rule("read", ProjectFrom.BODY),
        ("POST", "/v1/sweeps"): ADMIN,
        ("POST", "/v1/sweeps/{sweep_id}/approve"): ADMIN,
        ("GET", "/v1/actions"): Rule("read", ProjectFrom.LISTED),
        ("GET", "/v1/actions/{action_id}"): Rule("read", ProjectFrom.ACTION),
        ("POST", "/v1/actions/{action_id}/approve"): ADMIN,
        # policies and tiers are shared by every project
        ("GET", "/v1/policies"): READ,
        ("GET", "/v1/policies/{name}"): READ,
        ("PUT", "/v1/policies/{name}"): ADMIN,
        ("DELETE", "/v1/policies/{name}"): ADMIN,
        # a shadow policy's record: its would-be actions on the caller's projects' runs
        ("GET", "/v1/policies/{name}/shadow"): Rule("read", ProjectFrom.LISTED),
        ("GET", "/v1/tiers"): Rule("read", ProjectFrom.LISTED),  # usage: the caller's projects
        ("POST", "/v1/tokens"): ADMIN,
        ("GET", "/v1/tokens"): ADMIN,
        ("DELETE", "/v1/tokens/{token_id}"): ADMIN,
        # contract routes still to be built
        ("GET", "/v1/reports/cost"): Rule("read", ProjectFrom.LISTED),
        ("POST", "/v1/forecast"): READ,
        ("POST", "/v1/backtest"): Rule("read", ProjectFrom.BODY),
        ("POST", "/v1/planner"): READ,
        ("GET", "/v1/reconcile"): ADMIN,
        ("POST", "/v1/reconcile/orphans/delete"): ADMIN,
        ("GET", "/v1/audit"): ADMIN,
        # adopting existing trees: an admin's, whatever project they go to
        ("POST", "/v1/imports"): ADMIN,
        ("GET", "/v1/imports"): ADMIN,
        ("GET", "/v1/imports/{import_id}"): ADMIN,
        # operations: Prometheus scrapes with a `read` token for every project
        ("GET", "/metrics"): Rule("read", ProjectFrom.ALL),
    }
)

PATH_REFERENCES: Mapping[ProjectFrom, tuple[ProjectOf, str]] = MappingProxyType(
    {
        ProjectFrom.RUN: ("run", "run_id"),
        ProjectFrom.CHECKPOINT: ("checkpoint", "checkpoint_id"),
        ProjectFrom.ACTION: ("action", "action_id"),
    }
)


def document_security(schema: dict[str, Any]) -> None:
    """The OpenAPI document names the bearer scheme (so /docs offers to send a token) and
    the least scope of each operation; open operations need no token."""
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "an API token"}
    }
    schema["security"] = [{"bearer": []}]
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            rule = RULES.get((method.upper(), path))
            if rule is None:
                continue
            if rule.scope is None:
                operation["security"] = []
            else:
                operation["x-required-scope"] = rule.scope


def route_templates(routes: list[BaseRoute]) -> dict[int, str]:
    """id of each API route -> its full path template, as the rule table names it. Routes
    of included routers are matched as their own objects, without the include's prefix."""
    return {
        id(context.original_route): str(context.path)
        for context in iter_route_contexts(routes)
        if isinstance(context.original_route, APIRoute)
    }


def rule_for(request: Request) -> Rule | None:
    route = request.scope.get("route")
    templates: dict[int, str] = request.app.state.route_templates
    template = templates.get(id(route))
    if template is None:  # a route added after the app was built (found once, then kept)
        templates.update(route_templates(request.app.routes))
        template = templates.get(id(route))
    return RULES.get((request.method, template)) if template is not None else None


def bearer(header: str | None) -> str:
    """The token of `Authorization: Bearer <token>`. Messages never repeat the header."""
    if header is None:
        raise Unauthorized("this request needs a token: send 'Authorization: Bearer <token>'")
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret or " " in secret:
        raise Unauthorized(
            "malformed Authorization header: expected 'Bearer <token>'", invalid_token=True
        )
    return secret


async def _body_reference(request: Request) -> tuple[str | None, tuple[ProjectOf, str] | None]:
    """`project` (or else `run_id`) of a JSON body. The body is the one the route validates
    (FastAPI has read and parsed it already); one that is not JSON names no project, and
    the route refuses it."""
    try:
        body: Any = await request.json()
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    project, run_id = body.get("project"), body.get("run_id")
    if isinstance(project, str):
        return project, None
    if isinstance(run_id, str):
        return None, ("run", run_id)
    return None, None


async def authorize(request: Request) -> Principal:
    """The caller of this request, after checking it may make it; also kept as
    `request.state.principal`, for a route that takes no dependency (registration).

    Raises Unauthorized (401) without a live token and Forbidden (403) for a missing scope
    or a project outside the token's list. With CKPT_AUTH=off everyone is `anonymous` and
    may do everything, but a route without a rule is refused even then.
    """
    principal = await _checked(request)
    request.state.principal = principal
    return principal


async def _checked(request: Request) -> Principal:
    rule = rule_for(request)
    if rule is None:
        log.error(
            "route has no access rule: refused",
            extra={"method": request.method, "path": request.url.path},
        )
        raise Forbidden("no access rule covers this route")
    if rule.scope is None:
        return NOBODY
    if request.app.state.settings.auth == "off":
        return ANONYMOUS
    secret = bearer(request.headers.get("authorization"))
    project: str | None = None
    reference: tuple[ProjectOf, str] | None = None
    if rule.project is ProjectFrom.BODY:
        project, reference = await _body_reference(request)
    elif rule.project in PATH_REFERENCES:
        kind, param = PATH_REFERENCES[rule.project]
        reference = (kind, str(request.path_params[param]))
    return await anyio.to_thread.run_sync(
        token_principal, request.app.state.engine, secret, rule, project, reference
    )


def token_principal(
    engine: Engine,
    secret: str,
    rule: Rule,
    project: str | None,
    reference: tuple[ProjectOf, str] | None,
) -> Principal:
    """The principal of a live token allowed what `rule` asks, on `project` or else on the
    project of `reference`; one round trip. Blocking: call it from a worker thread."""
    return allowed_principal(lookup_token(engine, secret, reference), rule, project)


def allowed_principal(match: TokenMatch | None, rule: Rule, project: str | None) -> Principal:
    """The principal of a token's lookup, if it may do what `rule` asks on `project` (or
    else on the looked-up object's project); Unauthorized or Forbidden otherwise."""
    assert rule.scope is not None
    if match is None:
        raise Unauthorized("unknown or revoked token", invalid_token=True)
    principal = match.principal
    if not principal.allows(rule.scope):
        raise Forbidden(f"this token lacks the {rule.scope} scope", scope=rule.scope)
    if rule.project is ProjectFrom.ALL and principal.projects is not None:
        raise Forbidden('this covers every project: it needs a token for projects ["*"]')
    project = project if project is not None else match.project
    # An id that names nothing has no project: the route answers 404 for it.
    if project is not None and not principal.sees(project):
        raise Forbidden("this token is not allowed on that project")
    return principal
