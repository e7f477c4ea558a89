"""API tokens: created with a random secret shown once, stored as its hash, revoked at once.

A request's token is found by the hash of what it presents, in one indexed query that also
names the project of the run, checkpoint or action the request is about; no cache stands
between a revocation and the next request.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from app.db.dialect import insert_ignoring_conflicts, on_postgresql
from app.db.models import Token
from app.db.pagination import BadCursor, decode_cursor, encode_cursor
from app.domain.access import ALL_PROJECTS, SCOPES, Principal, token_principal
from app.domain.errors import Invalid, NotFound
from app.domain.ids import new_id
from app.services.catalog import audit

log = logging.getLogger("app.tokens")

SECRET_PREFIX = "ckpt_"  # recognisable in a leaked file or a secret scanner's rules
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_PROJECTS = 1000

ProjectOf = Literal["run", "checkpoint", "action"]


def new_secret() -> str:
    """256 random bits: no need for a slow hash, nor for a salt."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def normalise_grant(
    scopes: Iterable[str], projects: Iterable[str] | None
) -> tuple[list[str], list[str]]:
    """Sorted, de-duplicated scopes and projects; raises Invalid naming the field.

    An admin token is bounded by no project, so it takes `["*"]` (or nothing); a `read` or
    `register` token must say which projects it may touch (`["*"]` for all of them).
    """
    scope_list = sorted(set(scopes))
    if not scope_list:
        raise Invalid("give at least one of read, register, admin", field="scopes")
    unknown = [s for s in scope_list if s not in SCOPES]
    if unknown:
        raise Invalid(f"unknown scope {unknown[0]!r}: use read, register or admin", field="scopes")
    if projects is None:
        if "admin" not in scope_list:
            raise Invalid(
                'name the projects this token may touch, or ["*"] for all of them',
                field="projects",
            )
        return scope_list, [ALL_PROJECTS]
    project_list = sorted(set(projects))
    if not project_list:
        raise Invalid('give at least one project, or ["*"] for all of them', field="projects")
    if len(project_list) > MAX_PROJECTS:
        raise Invalid(f"at most {MAX_PROJECTS} projects", field="projects")
    if ALL_PROJECTS in project_list and len(project_list) > 1:
        raise Invalid('"*" already means every project: give it alone', field="projects")
    for project in project_list:
        if project != ALL_PROJECTS and not NAME_PATTERN.match(project):
            raise Invalid(f"{project!r} is not a project name", field="projects")
    if "admin" in scope_list and project_list != [ALL_PROJECTS]:
        raise Invalid(
            'an admin token is bounded by no project: give ["*"] or leave projects out',
            field="projects",
        )
    return scope_list, project_list


def _check_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise Invalid(
            "must be 1-63 characters: lower-case letters, digits, '.', '_' or '-'", field="name"
        )


def create_token(
    session: Session,
    *,
    name: str,
    scopes: Iterable[str],
    projects: Iterable[str] | None,
    actor: str,
    now: datetime,
) -> tuple[Token, str]:
    """A new token and its secret. The secret is returned here and nowhere else, ever."""
    _check_name(name)
    scope_list, project_list = normalise_grant(scopes, projects)
    secret = new_secret()
    token = Token(
        id=new_id("tok"),
        name=name,
        secret_hash=hash_secret(secret),
        scopes=scope_list,
        projects=project_list,
        created_at=now,
        created_by=actor,
    )
    session.add(token)
    session.flush()
    _audit_created(session, token)
    log.info(
        "token created",
        extra={"token_id": token.id, "token_name": name, "scopes": scope_list, "actor": actor},
    )
    return token, secret


def ensure_token(
    session: Session,
    *,
    name: str,
    secret: str,
    scopes: list[str],
    projects: list[str],
    actor: str,
    now: datetime,
) -> tuple[Token, bool]:
    """The token with this secret, created if absent; returns it and whether it was created.

    One INSERT ... ON CONFLICT DO NOTHING, so replicas starting together create one row. A
    revoked token stays revoked: its secret is never brought back to life by a restart.
    """
    token_id = new_id("tok")
    digest = hash_secret(secret)
    stmt = insert_ignoring_conflicts(session, Token).values(
        id=token_id,
        name=name,
        secret_hash=digest,
        scopes=scopes,
        projects=projects,
        created_at=now,
        created_by=actor,
    )
    session.execute(stmt)
    token = session.execute(select(Token).where(Token.secret_hash == digest)).scalar_one()
    created = token.id == token_id
    if created:
        _audit_created(session, token)
    return token, created


def _audit_created(session: Session, token: Token) -> None:
    """What the token may do; never its secret nor the secret's hash."""
    audit.record(
        session,
        actor=token.created_by,
        entity="token",
        entity_id=token.id,
        event="created",
        at=token.created_at,
        after={"name": token.name, "scopes": token.scopes, "projects": token.projects},
    )


def get_token(session: Session, token_id: str) -> Token:
    token = None if "\x00" in token_id else session.get(Token, token_id)
    if token is None:
        raise NotFound(f"no token has id {token_id!r}", field="token_id")
    return token


def list_tokens(
    session: Session, *, include_revoked: bool, limit: int, cursor: str | None
) -> tuple[list[Token], str | None]:
    """Newest first; revoked tokens only when asked for."""
    stmt = select(Token).order_by(Token.id.desc()).limit(limit + 1)
    if not include_revoked:
        stmt = stmt.where(Token.revoked_at.is_(None))
    if cursor is not None:
        (last,) = decode_cursor(cursor, str)
        if "\x00" in last:
            raise BadCursor("not a cursor this list handed out", field="cursor")
        stmt = stmt.where(Token.id < last)
    rows = list(session.execute(stmt).scalars())
    page = rows[:limit]
    return page, encode_cursor(page[-1].id) if len(rows) > limit else None


def revoke_token(session: Session, *, token_id: str, actor: str, now: datetime) -> Token:
    """Revoke at once: the next request with it is refused. Revoking again changes nothing."""
    token = get_token(session, token_id)
    if token.revoked_at is None:
        token.revoked_at = now
        token.revoked_by = actor
        session.flush()
        audit.record(
            session,
            actor=actor,
            entity="token",
            entity_id=token.id,
            event="revoked",
            at=now,
            before={"revoked_at": None},
            after={"revoked_at": now},
        )
        log.info(
            "token revoked",
            extra={"token_id": token.id, "token_name": token.name, "actor": actor},
        )
    return token


def count_live_admin_tokens(session: Session) -> int:
    """Tokens are few (people and jobs, not requests): counted here, not in SQL JSON."""
    rows = session.execute(select(Token.scopes).where(Token.revoked_at.is_(None))).scalars()
    return sum("admin" in scopes for scopes in rows)


# --- the per-request lookup -----------------------------------------------------------------

_PROJECT_OF: dict[ProjectOf, str] = {
    "run": "SELECT p.name FROM runs r JOIN projects p ON p.id = r.project_id WHERE r.id = :ref",
    "checkpoint": (
        "SELECT p.name FROM checkpoints c JOIN runs r ON r.id = c.run_id "
        "JOIN projects p ON p.id = r.project_id WHERE c.id = :ref"
    ),
    "action": (
        "SELECT p.name FROM actions a JOIN runs r ON r.id = a.run_id "
        "JOIN projects p ON p.id = r.project_id WHERE a.id = :ref"
    ),
}


def _lookup_sql(project_of: ProjectOf | None, *, pyformat: bool) -> str:
    project = f"({_PROJECT_OF[project_of]})" if project_of is not None else "NULL"
    sql = (
        f"SELECT t.id, t.name, t.scopes, t.projects, {project} FROM tokens t "
        "WHERE t.secret_hash = :hash AND t.revoked_at IS NULL"
    )
    return re.sub(r":(\w+)", r"%(\1)s", sql) if pyformat else sql


_SQL: dict[tuple[ProjectOf | None, bool], str] = {
    (kind, pyformat): _lookup_sql(kind, pyformat=pyformat)
    for kind in (None, *_PROJECT_OF)
    for pyformat in (False, True)
}


@dataclass(frozen=True, slots=True)
class TokenMatch:
    principal: Principal
    project: str | None  # the project of the referenced object; None when unknown or unasked


def _json_list(value: Any) -> list[str]:
    parsed = orjson.loads(value) if isinstance(value, str | bytes) else value
    return [str(item) for item in parsed]


def lookup_statement(
    secret: str, project_of: tuple[ProjectOf, str] | None, *, pyformat: bool
) -> tuple[str, dict[str, Any]]:
    """The lookup's SQL (`pyformat` for psycopg, else named) and its parameters."""
    kind, ref = project_of if project_of is not None else (None, None)
    if ref is not None and "\x00" in ref:  # no id holds one; PostgreSQL refuses it
        kind, ref = None, None
    return _SQL[kind, pyformat], {"hash": hash_secret(secret), "ref": ref}


def token_match(row: Any) -> TokenMatch | None:
    """What a lookup's row says: None for no row (an unknown or revoked token)."""
    if row is None:
        return None
    token_id, name, scopes, projects, project = row
    principal = token_principal(token_id, name, _json_list(scopes), _json_list(projects))
    return TokenMatch(principal, project)


def lookup_token(
    engine: Engine, secret: str, project_of: tuple[ProjectOf, str] | None = None
) -> TokenMatch | None:
    """The live token with this secret, or None; with `project_of` (kind, id), the name of
    that object's project as well. One round trip on a connection of its own, outside any
    transaction, so a registration's single-statement insert keeps its one round trip."""
    postgresql = on_postgresql(engine)
    sql, params = lookup_statement(secret, project_of, pyformat=postgresql)
    raw = engine.raw_connection()
    try:
        driver: Any = raw.driver_connection
        if postgresql:
            driver.autocommit = True
            try:
                with driver.cursor() as cursor:
                    cursor.execute(sql, params)
                    row = cursor.fetchone()
            finally:
                driver.autocommit = False
        else:
            cursor = driver.cursor()
            try:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            finally:
                cursor.close()
    finally:
        raw.close()
    return token_match(row)
