"""`ckpt audit`: who changed what, when and why (`GET /v1/audit`, admin), oldest first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, moment_text, print_table
from app.cli.remote import Remote, connected

AUDIT_COLUMNS = (
    Column("at"),
    Column("entity", drop=3),
    Column("id", role="id"),
    Column("event"),
    Column("actor", role="text", drop=1),
    Column("reason", role="text", drop=2),
)


def _changes(event: dict[str, Any]) -> str:
    after = event.get("after") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(after.items()))


def register(cli: typer.Typer) -> None:
    """Add `ckpt audit` to `cli`."""

    @cli.command()
    @connected
    def audit(
        remote: Remote,
        checkpoint: Annotated[
            str | None, typer.Option(help="a checkpoint's events and its actions'")
        ] = None,
        run: Annotated[str | None, typer.Option(help="a run's events")] = None,
        actor: Annotated[
            str | None, typer.Option(help="an actor, or a prefix ending in * (rule:*)")
        ] = None,
        since: Annotated[datetime | None, typer.Option(help="from this time, ISO 8601 UTC")] = None,
        limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 100,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """The audit trail, oldest first (admin)."""
        params: dict[str, Any] = {"checkpoint_id": checkpoint, "run_id": run, "actor": actor}
        if since is not None:
            params["since"] = (since if since.tzinfo else since.replace(tzinfo=UTC)).isoformat()
        events = remote.items("/v1/audit", params, limit=limit)
        if as_json:
            emit_json(events)
            return
        print_table(
            f"{len(events)} events",
            AUDIT_COLUMNS,
            [
                (
                    moment_text(e["at"]),
                    e["entity"],
                    e["entity_id"],
                    e["event"],
                    e["actor"],
                    e["reason"] or _changes(e),
                )
                for e in events
            ],
        )
