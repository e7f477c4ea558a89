"""`ckpt import URI --project P`: `POST /v1/imports`, then the import followed until it
ends, with a bar of the objects listed and the checkpoints registered, and a summary.

`ckpt import` waits for the service's answer at each poll only briefly: an import of a big
bucket runs for minutes on the service, and leaving the command (Ctrl-C) leaves it running
there, to be read back with `ckpt imports show ID`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, human_bytes, print_table, progress
from app.cli.remote import Remote, connected

POLL_SECONDS = 0.5
LAYOUTS = ("auto", "hf", "lightning", "dcp", "orbax", "megatron", "deepspeed", "generic")

imports_cli = typer.Typer(help="Imports: what each adopted, and what it left out.")
ITEM_COLUMNS = (
    Column("run", role="id"),
    Column("step", justify="right"),
    Column("layout", drop=2),
    Column("bytes", justify="right", drop=1),
    Column("uri", role="text", drop=3),
)
REPORTED_COLUMNS = (Column("key", role="id"), Column("why", role="text"))
LIST_COLUMNS = (
    Column("import", role="id"),
    Column("state"),
    Column("project", drop=2),
    Column("registered", justify="right"),
    Column("existing", justify="right", drop=1),
    Column("uri", role="text", drop=3),
)


def _summary(body: dict[str, Any]) -> None:
    verb = "would register" if body["dry_run"] else "registered"
    rows = [
        ("state", body["state"]),
        ("objects listed", str(body["listed"])),
        ("checkpoints found", str(body["discovered"])),
        (verb, f"{body['registered']} ({human_bytes(body['registered_bytes'])})"),
        ("already catalogued", str(body["existing"])),
        ("runs", str(body["runs"])),
        ("incomplete", str(body["incomplete_count"])),
        ("skipped", str(body["skipped_count"])),
        ("unrecognised objects", str(body["unrecognized"])),
    ]
    if body.get("sweep_id"):
        rows.append(("evaluated in sweep", body["sweep_id"]))
    title = f"import {body['id']} of {body['uri']} into {body['project']}"
    print_table(title, (Column("what"), Column("count", role="text")), rows)
    if body["error"]:
        typer.echo(f"failed: {body['error']}", err=True)


def _reported(title: str, entries: list[dict[str, str]], total: int) -> None:
    if entries:
        shown = (
            f"{title} ({total})"
            if total == len(entries)
            else f"{title} (first {len(entries)} of {total})"
        )
        print_table(shown, REPORTED_COLUMNS, [(e["key"], e["reason"]) for e in entries])


def render(body: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """The summary, what was not registered and why, and (dry) what would be."""
    _summary(body)
    _reported("incomplete", body["incomplete"], body["incomplete_count"])
    _reported("skipped", body["skipped"], body["skipped_count"])
    if body["dry_run"]:
        rows = [
            (i["run"], str(i["step"]), i["layout"], human_bytes(i["size_bytes"]), i["uri"])
            for i in items
        ]
        print_table(f"{len(items)} checkpoints would be registered", ITEM_COLUMNS, rows)
        keys = body["unrecognized_keys"]
        if keys:
            more = body["unrecognized"] - len(keys)
            tail = f" (and {more} more)" if more > 0 else ""
            typer.echo(f"unrecognised objects{tail}:")
            for key in keys:
                typer.echo(f"  {key}")


def follow(remote: Remote, import_id: str) -> dict[str, Any]:
    """Poll the import until it is no longer running, drawing its progress."""
    with progress("listing") as tick:
        while True:
            body: dict[str, Any] = remote.call(
                "GET", f"/v1/imports/{import_id}", params={"limit": 1}
            )
            tick.update(
                completed=body["registered"],
                total=None,
                description=(
                    f"{body['listed']} objects listed, {body['discovered']} checkpoints found, "
                    f"{body['registered']} {'to register' if body['dry_run'] else 'registered'}"
                ),
            )
            if body["state"] != "running":
                return body
            time.sleep(POLL_SECONDS)


def _finish(remote: Remote, body: dict[str, Any], as_json: bool) -> None:
    items = remote.items(f"/v1/imports/{body['id']}") if body["dry_run"] or as_json else []
    if as_json:
        emit_json({**body, "items": items, "next_cursor": None})
    else:
        render(body, items)
    if body["state"] == "failed":
        raise typer.Exit(1)


@connected
def start(
    remote: Remote,
    uri: Annotated[str, typer.Argument(help="the tree: file://, s3:// or gs://")],
    project: Annotated[str, typer.Option(help="the project the runs go to")],
    layout: Annotated[
        str, typer.Option(help=f"one of {', '.join(LAYOUTS)}; auto decides per directory")
    ] = "auto",
    run: Annotated[str | None, typer.Option(help="every checkpoint goes to this run")] = None,
    klass: Annotated[str, typer.Option("--class", help="class of what is adopted")] = "milestone",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="register nothing; list what would be")
    ] = False,
    active: Annotated[bool, typer.Option("--active", help="runs created stay active")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """Adopt the checkpoints under URI into PROJECT: runs named from the path, checkpoints
    `active`, each registered once however often the tree is imported. Leaving (Ctrl-C)
    leaves the import running on the service: `ckpt imports show ID --wait`."""
    request: dict[str, Any] = {
        "uri": uri,
        "project": project,
        "layout": layout,
        "class": klass,
        "dry_run": dry_run,
        "active": active,
    }
    if run is not None:
        request["run"] = run
    started = remote.call("POST", "/v1/imports", json=request, idempotent=False)
    _finish(remote, follow(remote, started["id"]), as_json)


@imports_cli.command("list")
@connected
def list_imports(
    remote: Remote,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """Every import, newest first."""
    found = remote.items("/v1/imports")
    if as_json:
        emit_json(found)
        return
    rows = [
        (i["id"], i["state"], i["project"], str(i["registered"]), str(i["existing"]), i["uri"])
        for i in found
    ]
    print_table(f"{len(found)} imports", LIST_COLUMNS, rows)


@imports_cli.command("show")
@connected
def show(
    remote: Remote,
    import_id: Annotated[str, typer.Argument(help="the import's id")],
    wait: Annotated[bool, typer.Option("--wait", help="follow it until it ends")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """One import: its counts, what it did not register and why (and, dry, what it would)."""
    body = (
        follow(remote, import_id)
        if wait
        else remote.call("GET", f"/v1/imports/{import_id}", params={"limit": 1})
    )
    _finish(remote, body, as_json)


def register(cli: typer.Typer) -> None:
    """Add `ckpt import` and `ckpt imports ...` to `cli`."""
    cli.command("import")(start)
    cli.add_typer(imports_cli, name="imports")
