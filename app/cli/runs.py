"""`ckpt runs list|show|end`: training runs as the service has them (`/v1/runs`)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, moment_text, print_table
from app.cli.remote import Remote, connected, segment, usage

runs_cli = typer.Typer(help="Training runs: list, show, end.", no_args_is_help=True)
RUN_COLUMNS = (
    Column("id", role="id"),
    Column("project", drop=3),
    Column("name"),
    Column("status"),
    Column("started", drop=4),
    Column("ended", drop=5),
    Column("policy", drop=2),
    Column("labels", role="text", drop=6),
)
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable")]
LimitOption = Annotated[int, typer.Option(min=1, help="at most this many (newest first)")]


class Status(StrEnum):
    active = "active"
    completed = "completed"
    failed = "failed"


def run_rows(runs: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            r["id"],
            r["project"],
            r["name"],
            r["status"],
            moment_text(r["started_at"]),
            moment_text(r["ended_at"]),
            r["policy"] or "",
            ", ".join(f"{k}={v}" for k, v in sorted(r["labels"].items())),
        )
        for r in runs
    ]


def print_runs(title: str, runs: list[dict[str, Any]]) -> None:
    print_table(title, RUN_COLUMNS, run_rows(runs))


def _labels(values: list[str]) -> list[str]:
    for value in values:
        key, sep, wanted = value.partition(":")
        if not sep or not key or not wanted:
            raise usage(f"--label: expected KEY:VALUE, got {value!r}")
    return values


@runs_cli.command("list")
@connected
def list_(
    remote: Remote,
    project: Annotated[str | None, typer.Option(help="only this project")] = None,
    status: Annotated[Status | None, typer.Option(help="only runs in this status")] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="KEY:VALUE a run must carry; repeat (all must)")
    ] = None,
    limit: LimitOption = 100,
    as_json: JsonOption = False,
) -> None:
    """Runs, filtered by project, status and labels (GET /v1/runs)."""
    params: dict[str, Any] = {
        "project": project,
        "status": status.value if status else None,
        "label": _labels(label or []) or None,
    }
    runs = remote.items("/v1/runs", params, limit=limit)
    if as_json:
        emit_json(runs)
        return
    print_runs(f"{len(runs)} runs", runs)


@runs_cli.command("show")
@connected
def show(
    remote: Remote,
    run_id: Annotated[str, typer.Argument(help="the run's id (run_...)")],
    as_json: JsonOption = False,
) -> None:
    """One run (GET /v1/runs/{id})."""
    run = remote.call("GET", f"/v1/runs/{segment(run_id)}")
    if as_json:
        emit_json(run)
        return
    print_runs(f"run {run['project']}/{run['name']}", [run])
    typer.echo(f"created by {run['created_by']}; last changed by {run['updated_by']}")
    if run["resumed_from"]:
        typer.echo(f"resumed from {run['resumed_from']}")


@runs_cli.command("end")
@connected
def end(
    remote: Remote,
    run_id: Annotated[str, typer.Argument(help="the run's id (run_...)")],
    failed: Annotated[bool, typer.Option("--failed", help="it failed (else: completed)")] = False,
    at: Annotated[
        datetime | None, typer.Option(help="when it ended, ISO 8601 UTC (default: now)")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Mark a run completed (or failed): its milestones' `run_ended` clocks start."""
    body: dict[str, Any] = {"status": "failed" if failed else "completed"}
    if at is not None:
        moment = at if at.tzinfo else at.replace(tzinfo=UTC)
        body["ended_at"] = moment.isoformat()
    run = remote.call("PATCH", f"/v1/runs/{segment(run_id)}", json=body)
    if as_json:
        emit_json(run)
        return
    typer.echo(f"run {run['id']} ({run['project']}/{run['name']}) {run['status']}")


def register(cli: typer.Typer) -> None:
    """Add `ckpt runs ...` to `cli`."""
    cli.add_typer(runs_cli, name="runs")
