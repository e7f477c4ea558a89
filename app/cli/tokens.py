"""`ckpt tokens create|list|revoke` (`ckpt token` is its older name): the service's
`/v1/tokens`, which needs an admin token. The first admin token of a deployment is
CKPT_BOOTSTRAP_TOKEN, seeded by the service at start; give people tokens of their own
with it, then revoke it if you like."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, moment_text, print_table, progress, stderr
from app.cli.remote import Remote, connected, segment

tokens_cli = typer.Typer(help="API tokens (admin): create, list, revoke.", no_args_is_help=True)


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


@tokens_cli.command("create")
@connected
def create(
    remote: Remote,
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
    body: dict[str, Any] = {"name": name, "scopes": [s.value for s in scope]}
    if project:
        body["projects"] = project
    # not retried once sent: a second attempt would make a second token, its secret lost
    row = remote.call("POST", "/v1/tokens", json=body, idempotent=False)
    if as_json:
        emit_json(row)
        return
    stderr().print(
        f"created token {row['id']} ({name}): scopes {', '.join(row['scopes'])}; "
        f"projects {', '.join(row['projects'])}. Store the secret below now: "
        "it is not shown again.",
        markup=False,
    )
    typer.echo(row["token"])


@tokens_cli.command("list")
@connected
def list_(
    remote: Remote,
    include_revoked: Annotated[bool, typer.Option("--all", help="revoked ones too")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """List tokens (never their secrets), newest first."""
    with progress("listing tokens"):
        rows = remote.items("/v1/tokens", {"include_revoked": include_revoked or None})
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
                moment_text(r["created_at"]),
                r["created_by"],
                moment_text(r["revoked_at"]),
            )
            for r in rows
        ],
    )


@tokens_cli.command("revoke")
@connected
def revoke(
    remote: Remote,
    token_id: Annotated[str, typer.Argument(help="the token's id (tok_...)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """Revoke a token: the next request made with it is refused."""
    remote.call("DELETE", f"/v1/tokens/{segment(token_id)}")
    if as_json:
        emit_json({"id": token_id, "revoked": True})
        return
    typer.echo(f"token {token_id} revoked")


def register(cli: typer.Typer) -> None:
    """Add `ckpt tokens ...` to `cli`, and `ckpt token ...` as its older name."""
    cli.add_typer(tokens_cli, name="tokens")
    cli.add_typer(tokens_cli, name="token", hidden=True)
