"""API tokens: create (the secret is in that answer only), list, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.deps import Cursor, Limit, NowDep, PrincipalDep, SessionDep
from app.api.schemas import Page, TokenCreate, TokenCreated, TokenRead
from app.db.models import Token
from app.services.catalog import tokens

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


def token_read(token: Token) -> TokenRead:
    return TokenRead.model_validate(token, from_attributes=True)


@router.post("", status_code=status.HTTP_201_CREATED)
def create_token(
    body: TokenCreate,
    session: SessionDep,
    principal: PrincipalDep,
    now: NowDep,
    response: Response,
) -> TokenCreated:
    """The answer holds the secret (`token`): it is shown this once and stored only hashed."""
    token, secret = tokens.create_token(
        session,
        name=body.name,
        scopes=body.scopes,
        projects=body.projects,
        actor=principal.actor,
        now=now,
    )
    response.headers["Cache-Control"] = "no-store"
    return TokenCreated(**token_read(token).model_dump(), token=secret)


@router.get("")
def list_tokens(
    session: SessionDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    include_revoked: Annotated[bool, Query(description="list revoked tokens too")] = False,
) -> Page[TokenRead]:
    rows, next_cursor = tokens.list_tokens(
        session, include_revoked=include_revoked, limit=limit, cursor=cursor
    )
    return Page[TokenRead](items=[token_read(t) for t in rows], next_cursor=next_cursor)


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: str, session: SessionDep, principal: PrincipalDep, now: NowDep) -> None:
    """Takes effect on the next request made with the token; revoking twice is harmless."""
    tokens.revoke_token(session, token_id=token_id, actor=principal.actor, now=now)
