"""`ckpt token create|list|revoke`: API tokens for operators with database access, e.g. the
first admin token of a deployment without CKPT_BOOTSTRAP_TOKEN."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from sqlalchemy.orm import Session, sessionmaker

from app.cli.common import checked_settings, open_database, operator, refused
from app.cli.output import Column, emit_json, moment, print_table, progress, stderr
from app.db.models import Token
from app.db.session import session_scope
from app.domain.errors import AppError
from app.services.catalog import tokens
from app.settings import Settings

token_cli = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)


class ScopeChoice(StrEnum):
    read = "read"
    register = "register"
    admin = "admin"


TOKEN_COLUMNS = (
    Column("id", role="id"),
    Column("name", role="text"),
    Column("scopes"),
    Column("projects", role="text", drop=2),
    Column("created", drop=4),
    Column("by", drop=5),
    Column("revoked", drop=3),
)


def _row(token: Token) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "scopes": token.scopes,
        "projects": token.projects,
        "created_at": token.created_at.isoformat(),
        "created_by": token.created_by,
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
        "revoked_by": token.revoked_by,
    }


def _minute(iso: str | None) -> str:
    return moment(datetime.fromisoformat(iso)) if iso else ""


def register(cli: typer.Typer, load: Callable[[], Settings] = checked_settings) -> None:
    """Add `ckpt token ...` to `cli`; `load` validates settings or exits."""

    def factory() -> sessionmaker[Session]:
        return open_database(load(), pool_size=1)

    @token_cli.command("create")
    def create(
        name: Annotated[str, typer.Argument(help="what the token is for, e.g. trainer-llama")],
        scope: Annotated[
            list[ScopeChoice], typer.Option("--scope", help="read, register or admin; repeat")
        ],
        project: Annotated[
            list[str] | None,
            typer.Option("--project", help="a project it may touch ('*': all); repeat"),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Create a token. Its secret is printed on stdout this once and never again."""
        with session_scope(factory()) as session:
            try:
                token, secret = tokens.create_token(
                    session,
                    name=name,
                    scopes=[s.value for s in scope],
                    projects=project or None,
                    actor=operator(),
                    now=datetime.now(UTC),
                )
            except AppError as error:
                raise refused(error) from None
            row = _row(token)
        if as_json:
            emit_json({**row, "token": secret})
            return
        stderr().print(
            f"created token {row['id']} ({name}): scopes {', '.join(row['scopes'])}; "
            f"projects {', '.join(row['projects'])}. Store the secret below now: "
            "it is not shown again."
        )
        typer.echo(secret)

    @token_cli.command("list")
    def list_(
        include_revoked: Annotated[bool, typer.Option("--all", help="revoked ones too")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """List tokens (never their secrets), newest first."""
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        with progress("listing tokens") as tick, session_scope(factory()) as session:
            while True:
                page, cursor = tokens.list_tokens(
                    session, include_revoked=include_revoked, limit=1000, cursor=cursor
                )
                rows.extend(_row(t) for t in page)
                tick.advance(len(page))
                if cursor is None:
                    break
        if as_json:
            emit_json(rows)
            return
        print_table(
            f"{len(rows)} tokens",
            TOKEN_COLUMNS,
            [
                (
                    r["id"],
                    r["name"],
                    ",".join(r["scopes"]),
                    ",".join(r["projects"]),
                    _minute(r["created_at"]),
                    r["created_by"],
                    _minute(r["revoked_at"]),
                )
                for r in rows
            ],
        )

    @token_cli.command("revoke")
    def revoke(token_id: Annotated[str, typer.Argument(help="the token's id (tok_...)")]) -> None:
        """Revoke a token: the next request made with it is refused."""
        with session_scope(factory()) as session:
            try:
                tokens.revoke_token(
                    session, token_id=token_id, actor=operator(), now=datetime.now(UTC)
                )
            except AppError as error:
                raise refused(error, 1) from None
        typer.echo(f"token {token_id} revoked")

    cli.add_typer(token_cli, name="token")
