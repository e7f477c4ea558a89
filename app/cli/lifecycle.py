"""`ckpt plan` and `ckpt sweep`: what the policies would do now, and doing it. Both ask the
service (`POST /v1/plan`, `POST /v1/sweeps`) and print what it answered as readable tables,
or as the answer itself with `--json`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.output import Column, emit_json, human_bytes, print_table, progress, usd_text
from app.cli.remote import Remote, connected, usage
from app.domain.errors import AppError
from app.policy.loading import parse_yaml

PLAN_COLUMNS = (
    Column("step", drop=5, justify="right"),
    Column("checkpoint", role="id"),
    Column("kind"),
    Column("from", drop=8),
    Column("to", drop=4),
    Column("bytes", drop=6, justify="right"),
    Column("state", drop=7),
    Column("rule", drop=9),
    Column("reason", role="text"),
)
KEPT_COLUMNS = (
    Column("step", drop=1, justify="right"),
    Column("checkpoint", role="id"),
    Column("why", role="text"),
)
ProjectOption = Annotated[str | None, typer.Option(help="only this project")]
RunOption = Annotated[str | None, typer.Option(help="only this run id")]
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable")]


def render_plan(plan: dict[str, Any], *, show_kept: bool) -> None:
    """A plan as `POST /v1/plan` answers it, as tables and one line per total."""
    actions = plan["actions"]
    rows = [
        (
            str(a["step"]),
            a["checkpoint_id"],
            a["kind"],
            a["from_tier"] or "",
            a["to_tier"] or "",
            human_bytes(a["bytes"]),
            a["state"],
            a["rule"],
            a["reason"],
        )
        for a in actions
    ]
    print_table(f"{len(actions)} planned actions", PLAN_COLUMNS, rows)
    if show_kept:
        print_table(
            f"{len(plan['kept'])} checkpoints kept",
            KEPT_COLUMNS,
            [(str(k["step"]), k["checkpoint_id"], "; ".join(k["reasons"])) for k in plan["kept"]],
        )
    totals = plan["totals"]
    for label, by_tier in (
        ("deleted from", totals["deleted_bytes_by_tier"]),
        ("moved from", totals["moved_bytes_by_tier"]),
        ("copied to", totals["copied_bytes_by_tier"]),
    ):
        for tier, size in sorted(by_tier.items()):
            typer.echo(f"{label} {tier}: {human_bytes(size)}")
    # One short line per tier: readable at 80 columns however many tiers change.
    for tier, amount in sorted(totals["usd_month_by_tier"].items()):
        typer.echo(f"storage on {tier}: {usd_text(amount, signed=True)}/month")
    if actions:
        monthly = usd_text(sum(a["usd_month"] for a in actions), signed=True)
        note = ", deletes saving from their purge" if totals["deleted_bytes_by_tier"] else ""
        typer.echo(f"storage in all: {monthly}/month{note}")
        typer.echo(f"one-off charges: {usd_text(totals['one_off_usd'])}")


def what_if(policy: str) -> str | dict[str, Any]:
    """`--policy`: a policy file is sent inline (a what-if, stored nowhere), anything else
    as the name of a stored policy."""
    path = Path(policy)
    if not path.is_file():
        if "/" in policy or path.suffix in (".yaml", ".yml"):  # meant as a file: a typo
            raise usage(f"--policy: no such file {policy!r}")
        return policy
    try:
        document = parse_yaml(path.read_text(), field=str(path))
    except AppError as error:
        raise usage(f"{path}: {error.message}") from None
    if not isinstance(document, dict):
        raise usage(f"{path}: a policy must be a mapping with name and rules")
    return document


def scope(project: str | None, run: str | None) -> dict[str, Any]:
    return {k: v for k, v in (("project", project), ("run_id", run)) if v is not None}


def ask_plan(remote: Remote, body: dict[str, Any]) -> dict[str, Any]:
    with progress("planning the catalog"):
        plan: dict[str, Any] = remote.call("POST", "/v1/plan", json=body, slow=True)
    return plan


def register(cli: typer.Typer) -> None:
    """Add `ckpt plan` and `ckpt sweep` to `cli`."""

    @cli.command()
    @connected
    def plan(
        remote: Remote,
        project: ProjectOption = None,
        run: RunOption = None,
        policy: Annotated[
            str | None, typer.Option(help="what-if: a policy file, or a stored policy's name")
        ] = None,
        kept: Annotated[bool, typer.Option(help="also list kept checkpoints")] = False,
        as_json: JsonOption = False,
    ) -> None:
        """Dry run: what the policies would do now, and why (POST /v1/plan)."""
        body = scope(project, run)
        if policy is not None:
            body["policy"] = what_if(policy)
        result = ask_plan(remote, body)
        if as_json:
            emit_json(result)
            return
        render_plan(result, show_kept=kept)

    @cli.command()
    @connected
    def sweep(
        remote: Remote,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="plan only")] = False,
        project: ProjectOption = None,
        run: RunOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Evaluate now and write the planned actions to the ledger (POST /v1/sweeps, admin);
        held deletes wait for `ckpt actions approve-sweep`."""
        if dry_run:
            result = ask_plan(remote, scope(project, run))
            if as_json:
                emit_json(result)
            else:
                render_plan(result, show_kept=False)
            return
        with progress("sweeping: planning and writing actions to the ledger"):
            answer = remote.call("POST", "/v1/sweeps", json=scope(project, run), slow=True)
        sweep_id, ids = answer["id"], answer["actions"]
        if as_json:
            emit_json({"sweep_id": sweep_id, "action_ids": ids})
            return
        typer.echo(f"sweep {sweep_id}: {len(ids)} actions written to the ledger")
        held = held_of(remote, set(ids))
        if held:
            typer.echo(
                f"{held} held beyond the blast radius: see `ckpt actions list --state held`, "
                f"release them with `ckpt actions approve-sweep {sweep_id}`"
            )


def held_of(remote: Remote, ids: set[str]) -> int:
    """How many of a sweep's actions are held (the ledger lists by state, not by sweep)."""
    if not ids:
        return 0
    return sum(1 for a in remote.items("/v1/actions", {"state": "held"}) if a["id"] in ids)
