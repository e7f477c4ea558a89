"""`ckpt actions list|show|approve|approve-sweep`: the action ledger (`/v1/actions`), and
releasing the deletes a sweep held back beyond its blast radius (admin)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, human_bytes, print_table
from app.cli.remote import Remote, connected, segment

actions_cli = typer.Typer(
    help="The action ledger: list, show, approve held actions.", no_args_is_help=True
)
FINAL_STATES = frozenset({"done", "failed", "cancelled"})
ACTION_COLUMNS = (
    Column("id", role="id"),
    Column("kind"),
    Column("state"),
    Column("checkpoint", role="id", drop=1),
    Column("step", drop=3, justify="right"),
    Column("from", drop=6),
    Column("to", drop=5),
    Column("bytes", drop=4, justify="right"),
    Column("rule", drop=7),
    Column("error", role="text", drop=2),
)
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable")]


class State(StrEnum):
    held = "held"
    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class Kind(StrEnum):
    delete = "delete"
    purge = "purge"
    move = "move"
    copy = "copy"
    restore = "restore"


def print_actions(title: str, actions: list[dict[str, Any]]) -> None:
    def size(a: dict[str, Any]) -> str:
        if a["state"] == "running" and a["bytes"]:
            return f"{human_bytes(a['bytes_done'])}/{human_bytes(a['bytes'])}"
        return human_bytes(a["bytes"])

    rows = [
        (
            a["id"],
            a["kind"],
            a["state"],
            a["checkpoint_id"],
            str(a["step"]),
            a["from_tier"] or "",
            a["to_tier"] or "",
            size(a),
            a["rule"],
            a["error"] or "",
        )
        for a in actions
    ]
    print_table(title, ACTION_COLUMNS, rows)


@actions_cli.command("list")
@connected
def list_(
    remote: Remote,
    state: Annotated[State | None, typer.Option(help="only this state")] = None,
    kind: Annotated[Kind | None, typer.Option(help="only this kind")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="only this checkpoint id")] = None,
    run: Annotated[str | None, typer.Option(help="only this run id")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 100,
    as_json: JsonOption = False,
) -> None:
    """The ledger (GET /v1/actions), filtered."""
    params = {
        "state": state.value if state else None,
        "kind": kind.value if kind else None,
        "checkpoint_id": checkpoint,
        "run_id": run,
    }
    actions = remote.items("/v1/actions", params, limit=limit)
    if as_json:
        emit_json(actions)
        return
    print_actions(f"{len(actions)} actions", actions)


@actions_cli.command("show")
@connected
def show(
    remote: Remote,
    action_id: Annotated[str, typer.Argument(help="the action's id (act_...)")],
    as_json: JsonOption = False,
) -> None:
    """One action, with its progress while it runs (GET /v1/actions/{id})."""
    action = remote.call("GET", f"/v1/actions/{segment(action_id)}")
    if as_json:
        emit_json(action)
        return
    print_actions(f"action on {action['checkpoint_id']}", [action])
    typer.echo(f"reason: {action['reason'] or ''}")
    typer.echo(f"asked by {action['actor']}" + (
        f"; approved by {action['approved_by']}" if action["approved_by"] else ""
    ))  # fmt: skip


@actions_cli.command("approve")
@connected
def approve(
    remote: Remote,
    action_ids: Annotated[list[str], typer.Argument(help="ids of held actions (act_...)")],
    as_json: JsonOption = False,
) -> None:
    """Release held actions (POST /v1/actions/{id}/approve, admin)."""
    released = [
        remote.call("POST", f"/v1/actions/{segment(action_id)}/approve") for action_id in action_ids
    ]
    if as_json:
        emit_json(released)
        return
    print_actions(f"{len(released)} actions approved", released)


@actions_cli.command("approve-sweep")
@connected
def approve_sweep(
    remote: Remote,
    sweep_id: Annotated[str, typer.Argument(help="the sweep's id (swp_...)")],
    as_json: JsonOption = False,
) -> None:
    """Release every action a sweep held (POST /v1/sweeps/{id}/approve, admin)."""
    answer = remote.call("POST", f"/v1/sweeps/{segment(sweep_id)}/approve")
    if as_json:
        emit_json({"sweep_id": answer["id"], "action_ids": answer["actions"]})
        return
    typer.echo(f"sweep {answer['id']}: {len(answer['actions'])} actions approved")


def register(cli: typer.Typer) -> None:
    """Add `ckpt actions ...` to `cli`."""
    cli.add_typer(actions_cli, name="actions")
