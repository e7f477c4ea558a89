"""`ckpt reconcile` and `ckpt reconcile delete-orphans`: `GET /v1/reconcile` and
`POST /v1/reconcile/orphans/delete` for operators with database access. Both list every
tier, which takes a while on a big bucket, so both show progress on a terminal; the keys
they print are what `delete-orphans` takes back, so tables never shorten them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from app.cli.common import checked_settings, open_catalog, operator
from app.cli.output import Column, emit_json, human_bytes, moment, print_table, progress
from app.services.lifecycle import reconcile as service
from app.settings import Settings

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


def _orphan(orphan: service.Orphan) -> dict[str, Any]:
    return {
        "tier": orphan.tier,
        "key": orphan.key,
        "uri": orphan.uri,
        "size_bytes": orphan.size_bytes,
        "modified": orphan.modified.isoformat() if orphan.modified else None,
    }


def _orphan_row(orphan: dict[str, Any]) -> tuple[str, ...]:
    modified = orphan["modified"]
    return (
        orphan["tier"],
        orphan["key"],
        human_bytes(orphan["size_bytes"]),
        moment(datetime.fromisoformat(modified) if modified else None),
    )


def scan_document(report: service.Report) -> dict[str, Any]:
    """The findings as `GET /v1/reconcile` answers them."""
    return {
        "orphans": [_orphan(o) for o in report.orphans],
        "drift": [
            {
                "checkpoint_id": d.checkpoint_id,
                "tier": d.tier,
                "key": d.key,
                "uri": d.uri,
                "problem": d.problem,
            }
            for d in report.drift
        ],
        "scanned_objects": report.scanned_objects,
        "unreachable": report.unreachable,
    }


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
            typer.echo(f"ckpt: orphans: expected TIER:KEY, got {value!r}", err=True)
            raise typer.Exit(2)
        names.append((tier, key))
    return names


def register(cli: typer.Typer, load: Callable[[], Settings] = checked_settings) -> None:
    """Add `ckpt reconcile ...` to `cli`; `load` validates settings or exits."""

    @reconcile_cli.callback()
    def scan(
        context: typer.Context,
        deep: Annotated[
            bool, typer.Option(help="also read the bytes of files whose tier has no checksum")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Compare every tier with the catalog now: objects no checkpoint owns (orphans) and
        catalogued files missing or changed (drift). Deletes nothing."""
        if context.invoked_subcommand is not None:
            return
        opened = open_catalog(load(), policies=False, pool_size=1)
        with progress(f"reconciling {len(opened.tiers)} tiers with the catalog"):
            report = service.reconcile(
                opened.factory,
                opened.tiers,
                storages=opened.storages,
                deep=deep,
                actor=operator(),
            )
        body = scan_document(report)
        if as_json:
            emit_json(body)
            return
        render_scan(body)

    @reconcile_cli.command("delete-orphans")
    def delete_orphans(
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
            typer.echo("ckpt: orphans: name the orphans, or give --all (not both)", err=True)
            raise typer.Exit(2)
        wanted = None if every else _names(orphans or [])
        opened = open_catalog(load(), policies=False, pool_size=1)
        with progress("scanning the tiers, then deleting orphans"):
            deleted, refused = service.delete_orphans(
                opened.factory,
                opened.tiers,
                wanted,
                storages=opened.storages,
                now=datetime.now(UTC),
            )
        body = {
            "deleted": [_orphan(o) for o in deleted],
            "refused": [{"tier": t, "key": k, "reason": r} for t, k, r in refused],
        }
        if as_json:
            emit_json(body)
            return
        deleted_rows = [_orphan_row(o) for o in body["deleted"]]
        print_table(f"{len(deleted)} orphans deleted", ORPHAN_COLUMNS, deleted_rows)
        if refused:
            print_table(
                f"{len(refused)} refused",
                REFUSED_COLUMNS,
                [(r["tier"], r["key"], r["reason"]) for r in body["refused"]],
            )

    cli.add_typer(reconcile_cli, name="reconcile")
