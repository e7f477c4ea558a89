"""Policies: list, read, replace (YAML or JSON), delete; a shadow policy's record."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, status

from app.api.deps import Cursor, Limit, NowDep, PrincipalDep, SessionDep, TiersDep
from app.api.lifecycle_schemas import PolicyRead
from app.api.schemas import NAME_PATTERN, Page, Timestamp
from app.api.shadow_schemas import (
    DivergenceRead,
    DivergentRead,
    RegretRead,
    ShadowActionRead,
    ShadowRead,
)
from app.db.models import PolicyRow
from app.db.pagination import decode_cursor, encode_cursor
from app.domain.errors import Invalid
from app.policy import loading
from app.services.catalog import policies
from app.services.cost.shadow import shadow_report

router = APIRouter(prefix="/v1/policies", tags=["policies"])

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


def _read(row: PolicyRow) -> PolicyRead:
    return PolicyRead(
        name=row.name,
        mode=row.document.get("mode", "enforce"),
        source=row.source,
        updated_at=row.updated_at,
        updated_by=row.updated_by,
        policy=row.document,
    )


@router.get("")
def list_policies(
    session: SessionDep, limit: Limit = 100, cursor: Cursor = None
) -> Page[PolicyRead]:
    rows = policies.list_policy_rows(session)
    if cursor is not None:
        (after,) = decode_cursor(cursor, str)
        rows = [r for r in rows if r.name > after]
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1].name) if len(rows) > limit else None
    return Page[PolicyRead](items=[_read(r) for r in page], next_cursor=next_cursor)


@router.get("/{name}")
def get_policy(name: str, session: SessionDep) -> PolicyRead:
    return _read(policies.get_policy_row(session, name))


async def _raw_body(request: Request) -> tuple[str, bytes]:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media, await request.body()


RawBody = Annotated[tuple[str, bytes], Depends(_raw_body)]


def _document(name: str, body: tuple[str, bytes]) -> object:
    media, raw = body
    if media in YAML_TYPES:
        document = loading.parse_yaml(raw)
    else:
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than a policy
            message = "body is neither JSON nor YAML sent as application/yaml"
            raise Invalid(message, field="body") from None
    if isinstance(document, dict):
        document.setdefault("name", name)
        if document["name"] != name:
            message = f"name {document['name']!r} differs from the path's {name!r}"
            raise Invalid(message, field="name")
    return document


@router.put("/{name}", openapi_extra=_BODY)
def put_policy(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: RawBody,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    now: NowDep,
    dry_run: Annotated[
        bool,
        Query(description="validate only: answer what would be stored, and store nothing"),
    ] = False,
) -> PolicyRead:
    """Validated before anything is stored; a name in the body must match the path. With
    `dry_run=true` nothing is stored: an editor checks a draft as it is typed."""
    policy = loading.validate_policy(_document(name, body), [t.name for t in tiers])
    if dry_run:
        document = loading.to_document(policy)
        return PolicyRead(
            name=name,
            mode=policy.mode,
            source="api",
            updated_at=now,
            updated_by=principal.actor,
            policy=document,
        )
    return _read(
        policies.store_policy(session, policy, source="api", actor=principal.actor, now=now)
    )


@router.get("/{name}/shadow")
def get_shadow(
    name: str,
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    since: Annotated[
        Timestamp | None,
        Query(description="ISO 8601 (without an offset it is UTC): what was recorded since"),
    ] = None,
) -> ShadowRead:
    """What the policy would have done as a shadow policy (its would-be actions), how that
    differs from what the policy in force did, and what people came back for that it would
    have deleted or moved. A token bounded to some projects sees those projects' runs."""
    report = shadow_report(
        session, name=name, tiers=tiers, since=since, projects=principal.projects
    )
    return ShadowRead(
        policy=report.policy,
        mode=report.mode,
        actions=[ShadowActionRead.model_validate(a, from_attributes=True) for a in report.actions],
        divergence=DivergenceRead(
            bytes_freed=report.bytes_freed,
            usd_month=report.usd_month,
            only_shadow=[DivergentRead(**asdict(d)) for d in report.only_shadow],
            only_enforced=[DivergentRead(**asdict(d)) for d in report.only_enforced],
        ),
        regrets=[RegretRead(**asdict(r)) for r in report.regrets],
    )


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_policy(name: str, session: SessionDep, principal: PrincipalDep, now: NowDep) -> None:
    policies.delete_policy(session, name, actor=principal.actor, now=now)
