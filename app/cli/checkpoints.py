"""`ckpt checkpoints list|show|pin|unpin|delete|undelete|restore`: what a person does to
checkpoints by hand, through the service (admin for all but list and show).

`restore --wait` polls the restore action until a worker has finished it, drawing its
bytes on stderr as it goes, so the command ends when the copy is on the tier (exit 0) or
the action has failed (exit 1)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from app.cli.actions import FINAL_STATES, print_actions
from app.cli.output import Column, emit_json, human_bytes, moment_text, print_table, progress
from app.cli.remote import EXIT_REFUSED, Remote, connected, segment

checkpoints_cli = typer.Typer(
    help="Checkpoints: list, show, pin, unpin, delete, undelete, restore.", no_args_is_help=True
)
CHECKPOINT_COLUMNS = (
    Column("step", justify="right"),
    Column("id", role="id"),
    Column("class", drop=3),
    Column("state"),
    Column("tier", drop=4),
    Column("size", drop=5, justify="right"),
    Column("pinned", drop=2),
    Column("created", drop=6),
)
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable")]
IdArgument = Annotated[str, typer.Argument(help="the checkpoint's id (ckpt_...)")]
POLL_FIRST, POLL_MOST = 0.2, 2.0  # seconds between polls of a restore: quick, then calmer


class State(StrEnum):
    writing = "writing"
    active = "active"
    trashed = "trashed"
    deleted = "deleted"


def checkpoint_rows(items: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            str(c["step"]),
            c["id"],
            c["class"],
            c["state"],
            c["tier"] or "",
            human_bytes(c["size_bytes"]),
            "yes" if c["pinned"] else "",
            moment_text(c["created_at"]),
        )
        for c in items
    ]


def print_checkpoint(checkpoint: dict[str, Any]) -> None:
    print_table(f"checkpoint of run {checkpoint['run_id']}", CHECKPOINT_COLUMNS,
                checkpoint_rows([checkpoint]))  # fmt: skip
    # A uri is copied whole into other tools: one line each, never a cut table cell.
    for loc in checkpoint["locations"]:
        typer.echo(f"{loc['role']} on {loc['tier']}: {loc['uri']}")
    if checkpoint["pinned"]:
        typer.echo(f"pinned: {checkpoint['pin_reason']}")
    if checkpoint.get("protected_until"):
        typer.echo(f"protected from policy until {moment_text(checkpoint['protected_until'])}")
    if checkpoint.get("health") == "drift":
        typer.echo(f"drift: {checkpoint.get('health_detail')}")
    for name, value in sorted(checkpoint["metrics"].items()):
        typer.echo(f"metric {name}: {value:g}")


def _said(checkpoint: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        emit_json(checkpoint)
    else:
        typer.echo(f"checkpoint {checkpoint['id']} (step {checkpoint['step']}) {what}")


@checkpoints_cli.command("list")
@connected
def list_(
    remote: Remote,
    run_id: Annotated[str, typer.Argument(help="the run's id (run_...)")],
    cls: Annotated[str | None, typer.Option("--class", help="only this class")] = None,
    state: Annotated[State | None, typer.Option(help="only this state")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 100,
    as_json: JsonOption = False,
) -> None:
    """A run's checkpoints, newest step first, deleted ones too unless --state says."""
    params = {"class": cls, "state": state.value if state else None}
    items = remote.items(f"/v1/runs/{segment(run_id)}/checkpoints", params, limit=limit)
    if as_json:
        emit_json(items)
        return
    print_table(f"{len(items)} checkpoints", CHECKPOINT_COLUMNS, checkpoint_rows(items))


@checkpoints_cli.command("show")
@connected
def show(remote: Remote, checkpoint_id: IdArgument, as_json: JsonOption = False) -> None:
    """One checkpoint with its locations (GET /v1/checkpoints/{id})."""
    checkpoint = remote.call("GET", f"/v1/checkpoints/{segment(checkpoint_id)}")
    if as_json:
        emit_json(checkpoint)
        return
    print_checkpoint(checkpoint)


@checkpoints_cli.command("pin")
@connected
def pin(
    remote: Remote,
    checkpoint_id: IdArgument,
    reason: Annotated[str, typer.Option(help="why it must stay (shown with it)")],
    as_json: JsonOption = False,
) -> None:
    """Pin a checkpoint: no policy moves it off its tier or deletes it."""
    path = f"/v1/checkpoints/{segment(checkpoint_id)}/pin"
    _said(remote.call("POST", path, json={"reason": reason}), as_json, "pinned")


@checkpoints_cli.command("unpin")
@connected
def unpin(remote: Remote, checkpoint_id: IdArgument, as_json: JsonOption = False) -> None:
    """Unpin a checkpoint: the policies apply to it again."""
    path = f"/v1/checkpoints/{segment(checkpoint_id)}/pin"
    _said(remote.call("DELETE", path), as_json, "unpinned")


@checkpoints_cli.command("delete")
@connected
def delete(remote: Remote, checkpoint_id: IdArgument, as_json: JsonOption = False) -> None:
    """Delete a checkpoint to the trash (restorable with undelete until the trash period
    ends); refused while it is pinned."""
    action = remote.call("DELETE", f"/v1/checkpoints/{segment(checkpoint_id)}")
    if as_json:
        emit_json(action)
        return
    typer.echo(f"checkpoint {checkpoint_id}: delete queued as {action['id']} ({action['state']})")


@checkpoints_cli.command("undelete")
@connected
def undelete(remote: Remote, checkpoint_id: IdArgument, as_json: JsonOption = False) -> None:
    """Bring a checkpoint back from the trash, protected from policy for the trash period."""
    path = f"/v1/checkpoints/{segment(checkpoint_id)}/undelete"
    _said(remote.call("POST", path), as_json, "undeleted")


@checkpoints_cli.command("restore")
@connected
def restore(
    remote: Remote,
    checkpoint_id: IdArgument,
    tier: Annotated[str, typer.Option(help="the tier to stage a copy onto, e.g. hot")],
    at: Annotated[
        datetime | None, typer.Option(help="not before this time, ISO 8601 UTC (default: now)")
    ] = None,
    wait: Annotated[bool, typer.Option(help="wait until a worker has done it")] = False,
    max_wait: Annotated[
        float | None, typer.Option(min=0, help="with --wait: give up after this many seconds")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Stage a copy of a checkpoint onto a tier (POST .../restore). With --wait, follow
    the action until it is done (exit 0) or has failed (exit 1)."""
    body: dict[str, Any] = {"tier": tier}
    if at is not None:
        body["at"] = (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()
    action = remote.call("POST", f"/v1/checkpoints/{segment(checkpoint_id)}/restore", json=body)
    if wait:
        action = follow(remote, action, max_wait)
    if as_json:
        emit_json(action)
    else:
        print_actions(f"restore of {checkpoint_id} onto {tier}", [action])
    if wait and action["state"] != "done":
        why = action["error"] or f"it is {action['state']}"
        typer.echo(f"ckpt: restore {action['id']} did not finish: {why}", err=True)
        raise typer.Exit(EXIT_REFUSED)


def follow(remote: Remote, action: dict[str, Any], max_wait: float | None) -> dict[str, Any]:
    """Poll the action until it ends (or `max_wait` seconds pass), its bytes on a bar."""
    deadline = None if max_wait is None else time.monotonic() + max_wait
    pause = POLL_FIRST
    with progress(f"restoring {action['checkpoint_id']}", total=action["bytes"] or None) as bar:
        while action["state"] not in FINAL_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(pause if deadline is None else min(pause, deadline - time.monotonic()))
            pause = min(POLL_MOST, pause * 1.5)
            action = remote.call("GET", f"/v1/actions/{segment(action['id'])}")
            phase = f" ({action['phase']})" if action.get("phase") else ""
            bar.update(
                completed=action["bytes_done"],
                total=action["bytes"] or None,
                description=f"restoring: {action['state']}{phase}",
            )
    return action


def register(cli: typer.Typer) -> None:
    """Add `ckpt checkpoints ...` to `cli`."""
    cli.add_typer(checkpoints_cli, name="checkpoints")
