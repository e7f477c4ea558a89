"""`ckpt plan`, `ckpt sweep`, `ckpt worker`, `ckpt scheduler`, `ckpt policy ...`:
commands for operators with database access, printing readable tables."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from prometheus_client import start_http_server

from app.cli.common import Catalog, checked_settings, open_catalog, operator, refused
from app.cli.output import Column, emit_json, human_bytes, print_table, progress, usd_text
from app.db.session import session_scope
from app.domain.errors import AppError
from app.logging import configure_logging
from app.policy.loading import parse_yaml, validate_policy
from app.policy.schema import policy_json_schema
from app.scheduler.runtime import Runtime
from app.services.lifecycle.planning import CatalogPlan, plan_catalog
from app.services.lifecycle.sweep import run_sweep
from app.settings import Settings
from app.tiers_config import load_tiers

DRAIN_LIMIT = 10_000  # as Worker.drain: one `--once` run ends even if actions keep coming
policy_cli = typer.Typer(help="Policy files: schema and validation.", no_args_is_help=True)


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


def plan_document(plan: CatalogPlan) -> dict[str, Any]:
    """The plan as `ckpt plan --json` and `ckpt sweep --dry-run --json` print it."""
    return {
        "actions": [
            {
                **asdict(a.action),
                "state": a.state,
                "usd_month": a.usd_month,
                "one_off_usd": a.one_off_usd,
            }
            for a in plan.items
        ],
        "kept": [asdict(k) for k in plan.kept],
        "skipped": [asdict(s) for s in plan.skipped],
        "totals": plan.totals(),
    }


def render_plan(plan: CatalogPlan, *, show_kept: bool) -> None:
    rows = []
    for item in plan.items:
        a = item.action
        rows.append(
            (
                str(a.step),
                a.checkpoint_id,
                a.kind,
                a.from_tier or "",
                a.to_tier or "",
                human_bytes(a.bytes),
                item.state,
                a.rule,
                a.reason,
            )
        )
    print_table(f"{len(plan.items)} planned actions", PLAN_COLUMNS, rows)
    if show_kept:
        print_table(
            f"{len(plan.kept)} checkpoints kept",
            KEPT_COLUMNS,
            [(str(k.step), k.checkpoint_id, "; ".join(k.reasons)) for k in plan.kept],
        )
    totals = plan.totals()
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
    if plan.items:
        monthly = usd_text(sum(i.usd_month for i in plan.items), signed=True)
        note = ", deletes saving from their purge" if totals["deleted_bytes_by_tier"] else ""
        typer.echo(f"storage in all: {monthly}/month{note}")
        typer.echo(f"one-off charges: {usd_text(totals['one_off_usd'])}")


def _serve_metrics(settings: Settings) -> None:
    """A worker's or scheduler's own counters (bytes moved and purged, actions finished, lag,
    retries, sweep durations) on CKPT_METRICS_PORT, for Prometheus to scrape each replica.
    They hold no catalog data, so this port asks for no token: keep it inside the cluster."""
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.host)


def _runtime(ctx: Catalog, *, worker: bool, scheduler: bool, evaluator: bool) -> Runtime:
    configure_logging()
    return Runtime(
        ctx.factory,
        ctx.tiers,
        sweep_interval=ctx.settings.sweep_interval,
        trash_retention=ctx.settings.trash_retention,
        reconcile_interval=ctx.settings.reconcile_interval,
        worker=worker,
        scheduler=scheduler,
        evaluator=evaluator,
        storages=ctx.storages,
    )


def register(cli: typer.Typer, load: Callable[[], Settings] = checked_settings) -> None:
    """Add the lifecycle commands to `cli`; `load` validates settings or exits."""

    @cli.command()
    def plan(
        project: Annotated[str | None, typer.Option(help="only this project")] = None,
        run: Annotated[str | None, typer.Option(help="only this run id")] = None,
        policy: Annotated[Path | None, typer.Option(help="what-if: a policy file")] = None,
        kept: Annotated[bool, typer.Option(help="also list kept checkpoints")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Dry run: what the policies would do now, and why."""
        ctx = open_catalog(load())
        factory, tiers = ctx.factory, ctx.tiers
        try:
            what_if = (
                validate_policy(
                    parse_yaml(policy.read_text(), field=str(policy)), [t.name for t in tiers]
                )
                if policy is not None
                else None
            )
            with progress("planning the catalog"), session_scope(factory) as session:
                result = plan_catalog(
                    session,
                    tiers=tiers,
                    now=datetime.now(UTC),
                    project=project,
                    run_id=run,
                    policy=what_if,
                )
        except AppError as error:
            raise refused(error) from None
        if as_json:
            emit_json(plan_document(result))
            return
        render_plan(result, show_kept=kept)

    @cli.command()
    def sweep(
        dry_run: Annotated[bool, typer.Option("--dry-run", help="plan only")] = False,
        project: Annotated[str | None, typer.Option(help="only this project")] = None,
        run: Annotated[str | None, typer.Option(help="only this run id")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Evaluate now and write the planned actions to the ledger."""
        ctx = open_catalog(load())
        factory, tiers = ctx.factory, ctx.tiers
        now = datetime.now(UTC)
        if dry_run:
            with progress("planning the catalog"), session_scope(factory) as session:
                result = plan_catalog(session, tiers=tiers, now=now, project=project, run_id=run)
            if as_json:
                emit_json(plan_document(result))
            else:
                render_plan(result, show_kept=False)
            return
        with progress("sweeping: planning and writing actions to the ledger"):
            sweep_id, ids = run_sweep(
                factory,
                tiers=tiers,
                now=now,
                trigger="manual",
                actor=operator(),
                project=project,
                run_id=run,
            )
        if as_json:
            emit_json({"sweep_id": sweep_id, "action_ids": ids})
            return
        typer.echo(f"sweep {sweep_id}: {len(ids)} actions written to the ledger")

    def _run_until_signal(runtime: Runtime) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        runtime.start()
        stop.wait()
        runtime.stop()

    @cli.command()
    def worker(
        once: Annotated[bool, typer.Option(help="execute what is due, then exit")] = False,
    ) -> None:
        """Execute ledger actions (run as many as you like)."""
        ctx = open_catalog(load())
        runtime = _runtime(ctx, worker=True, scheduler=False, evaluator=False)
        if once:
            executed = 0
            with progress("executing due actions") as tick:
                while executed < DRAIN_LIMIT and runtime.executor.run_once():
                    executed += 1
                    tick.advance()
            typer.echo(f"{executed} actions executed")
            return
        _serve_metrics(ctx.settings)
        _run_until_signal(runtime)

    @cli.command()
    def scheduler() -> None:
        """Periodic sweep and purge, and the evaluations registrations ask for (several
        replicas are safe: evaluations take a lock)."""
        ctx = open_catalog(load())
        runtime = _runtime(ctx, worker=False, scheduler=True, evaluator=True)
        _serve_metrics(ctx.settings)
        _run_until_signal(runtime)

    cli.add_typer(policy_cli, name="policy")


@policy_cli.command("schema")
def schema() -> None:
    """Print the JSON Schema of policy files."""
    typer.echo(json.dumps(policy_json_schema(), indent=2))


@policy_cli.command("validate")
def validate(files: list[Path]) -> None:
    """Validate policy files against the default tiers or CKPT_TIERS_FILE."""
    from app.settings import load_settings

    tiers = [t.name for t in load_tiers(load_settings())]
    failed = False
    for path in files:
        try:
            policy = validate_policy(parse_yaml(path.read_text(), field=str(path)), tiers)
            typer.echo(f"{path}: ok ({policy.name}, {len(policy.rules)} rules)")
        except AppError as error:
            failed = True
            typer.echo(f"{path}: {error.field}: {error.message}", err=True)
    if failed:
        raise typer.Exit(1)
