"""`ckpt reconcile` and `ckpt reconcile delete-orphans`: `GET /v1/reconcile` and
`POST /v1/reconcile/orphans/delete` (admin), asked of the service. Both list every
tier, which takes a while on a big bucket, so both show progress on a terminal; the keys
they print are what `delete-orphans` takes back, so tables never shorten them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, human_bytes, moment_text, print_table, progress
from app.cli.remote import (
    Remote,
    TimeoutOption,
    TokenOption,
    UrlOption,
    connected,
    explain,
    open_remote,
    usage,
)
from ckpt_client.errors import CatalogError

reconcile_cli = typer.Typer(
    help="Compare every tier with the catalog; delete orphans when asked.",
    invoke_without_command=True,
)
ORPHAN_COLUMNS = (
    Column("tier"),
    Column("key", role="id"),
    Column("bytes", drop=2, justify="right"),
    Column("modified", drop=1),
)
DRIFT_COLUMNS = (
    Column("checkpoint", role="id"),
    Column("tier", drop=1),
    Column("key", role="text", drop=2),
    Column("problem", role="text"),
)
REFUSED_COLUMNS = (Column("tier"), Column("key", role="id"), Column("why", role="text"))


def _orphan_row(orphan: dict[str, Any]) -> tuple[str, ...]:
    return (
        orphan["tier"],
        orphan["key"],
        human_bytes(orphan["size_bytes"]),
        moment_text(orphan["modified"]),
    )


def render_scan(body: dict[str, Any]) -> None:
    print_table(
        f"{len(body['orphans'])} orphans", ORPHAN_COLUMNS, [_orphan_row(o) for o in body["orphans"]]
    )
    print_table(
        f"{len(body['drift'])} drifting files",
        DRIFT_COLUMNS,
        [(d["checkpoint_id"], d["tier"], d["key"], d["problem"]) for d in body["drift"]],
    )
    typer.echo(f"{body['scanned_objects']} objects scanned")
    for tier, why in sorted(body["unreachable"].items()):
        typer.echo(f"tier {tier} not scanned: {why}")


def _names(values: list[str]) -> list[tuple[str, str]]:
    names = []
    for value in values:
        tier, sep, key = value.partition(":")
        if not sep or not tier or not key:
            raise usage(f"orphans: expected TIER:KEY, got {value!r}")
        names.append((tier, key))
    return names


@reconcile_cli.callback()
def scan(
    context: typer.Context,
    deep: Annotated[
        bool, typer.Option(help="also read the bytes of files whose tier has no checksum")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ckpt_url: UrlOption = None,
    ckpt_token: TokenOption = None,
    ckpt_timeout: TimeoutOption = None,
) -> None:
    """Compare every tier with the catalog now: objects no checkpoint owns (orphans) and
    catalogued files missing or changed (drift). Deletes nothing."""
    if context.invoked_subcommand is not None:
        return
    remote = open_remote(ckpt_url, ckpt_token, ckpt_timeout, context)
    try:
        with progress("reconciling the tiers with the catalog"):
            body = remote.call("GET", "/v1/reconcile", params={"deep": deep}, slow=True)
    except CatalogError as error:
        raise explain(error) from None
    finally:
        remote.close()
    if as_json:
        emit_json(body)
        return
    render_scan(body)


@reconcile_cli.command("delete-orphans")
@connected
def delete_orphans(
    remote: Remote,
    orphans: Annotated[
        list[str] | None, typer.Argument(help="TIER:KEY of each orphan, as listed")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="every orphan found")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """Delete the orphans named, or every one with --all.

    Only those a fresh scan still finds orphaned and that were written over an hour ago
    go (a job may write before it registers); the rest are listed as refused."""
    if bool(orphans) == every:
        raise usage("orphans: name the orphans, or give --all (not both)")
    request: dict[str, Any] = (
        {"all": True}
        if every
        else {"orphans": [{"tier": t, "key": k} for t, k in _names(orphans or [])]}
    )
    with progress("scanning the tiers, then deleting orphans"):
        body = remote.call("POST", "/v1/reconcile/orphans/delete", json=request, slow=True)
    if as_json:
        emit_json(body)
        return
    deleted, refused = body["deleted"], body["refused"]
    print_table(
        f"{len(deleted)} orphans deleted", ORPHAN_COLUMNS, [_orphan_row(o) for o in deleted]
    )
    if refused:
        print_table(
            f"{len(refused)} refused",
            REFUSED_COLUMNS,
            [(r["tier"], r["key"], r["reason"]) for r in refused],
        )


def register(cli: typer.Typer) -> None:
    """Add `ckpt reconcile ...` to `cli`."""
    cli.add_typer(reconcile_cli, name="reconcile")
