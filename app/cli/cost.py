"""`ckpt report`, `ckpt forecast`, `ckpt planner`: what checkpoints cost now, what a run
will cost under a policy (with a chart), and how big and how often to checkpoint. Each
asks the service (`GET /v1/reports/cost`, `POST /v1/forecast`, `POST /v1/planner`), which
knows the tiers' prices and the stored policies; the chart is drawn here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli.answers import ask_and_show
from app.cli.chart import render_forecast
from app.cli.lifecycle import what_if
from app.cli.output import (
    Column,
    emit_json,
    human_bytes,
    print_table,
    progress,
    usd,
)
from app.cli.remote import Remote, connected, usage

if TYPE_CHECKING:  # the answers' models, imported when an answer is read: they pull in the
    # service's cost code, which a command that only asks need not load to start
    from app.api.cost_schemas import ForecastRead
    from app.api.planner_schemas import PlannerRead

GROUPS = ("tier", "project", "run", "class")  # GET /v1/reports/cost's group_by

DEFAULT_SCHEDULE = ("rolling=3h", "milestone=1d", "final=end")
TB = 10**12


def _pairs(values: list[str], option: str) -> dict[str, str]:
    """`NAME=VALUE` options as a dict, in the order given."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise usage(f"{option}: expected NAME=VALUE, got {value!r}")
        out[name.strip()] = rest.strip()
    return out


def _prices(values: list[str]) -> dict[str, dict[str, Any]]:
    """`--price TIER=USD` (storage per GB-month) or TIER=provider/CLASS, as the request's
    `prices`: `*` stays `*`, so it layers under the tiers named as the API's does."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in _pairs(values, "--price").items():
        try:
            out[name] = {"storage_gb_month": float(value)}
        except ValueError:
            out[name] = {"catalog": value}
    return out


def _billed(values: list[str]) -> dict[str, str | None]:
    """`--billed-after-delete TIER=DURATION` (or TIER=forever) as the request's
    `billed_after_delete`: `forever` is the API's null."""
    return {
        name: None if value == "forever" else value
        for name, value in _pairs(values, "--billed-after-delete").items()
    }


def render_report(body: dict[str, Any]) -> None:
    columns = (
        Column("key", role="id"),
        Column("bytes", justify="right"),
        Column("checkpoints", drop=2, justify="right"),
        Column("trashed", drop=1, justify="right"),
        Column("$/month", justify="right"),
    )
    rows = [
        (
            (row["name"] or row["key"])
            + (" (deleted, still billed)" if row.get("kind") == "deleted_billed" else ""),
            human_bytes(row["bytes"]),
            str(row["checkpoints"]),
            human_bytes(row["trashed_bytes"]),
            usd(row["usd_month"]),
        )
        for row in body["rows"]
    ]
    print_table(f"cost by {body['group_by']}", columns, rows)
    total = f"total: {human_bytes(body['total_bytes'])}, {usd(body['total_usd_month'])}/month"
    if body.get("deleted_billed_bytes"):
        total += (
            f", of which deleted but still billed: {human_bytes(body['deleted_billed_bytes'])}, "
            f"{usd(body['deleted_billed_usd_month'])}/month"
        )
    typer.echo(total)


def render_forecast_table(result: ForecastRead, every: int) -> None:
    keep = result.keep_everything
    tiers = [
        t
        for t in result.at_run_end.bytes_by_tier
        if any(d.bytes_by_tier.get(t) for d in result.series)
    ] or list(result.at_run_end.bytes_by_tier)[:1]
    deleted = any(d.deleted_billed_bytes for d in result.series)
    columns = (
        Column("day", justify="right"),
        *[Column(t, drop=3, justify="right") for t in tiers],
        Column("total", justify="right"),
        *([Column("deleted, billed", drop=2, justify="right")] if deleted else []),
        Column("$/month", justify="right"),
        Column("keep everything", drop=2, justify="right"),
        Column("$/month (keep)", drop=1, justify="right"),
    )
    rows = []
    for policy_day, keep_day in zip(result.series, keep.series, strict=True):
        last = policy_day.day == result.horizon_days
        if policy_day.day % every and policy_day.day != result.run_days and not last:
            continue
        rows.append(
            (
                str(policy_day.day),
                *[human_bytes(policy_day.bytes_by_tier.get(t, 0)) for t in tiers],
                human_bytes(policy_day.bytes),
                *([human_bytes(policy_day.deleted_billed_bytes)] if deleted else []),
                usd(policy_day.usd_month),
                human_bytes(keep_day.bytes),
                usd(keep_day.usd_month),
            )
        )
    print_table(f"forecast: policy {result.policy}, {result.concurrent_runs} run(s)", columns, rows)
    end, keep_end = result.at_run_end, keep.at_run_end
    billed = (
        f" + {human_bytes(end.deleted_billed_bytes)} deleted, still billed"
        if end.deleted_billed_bytes
        else ""
    )
    typer.echo(
        f"at run end: {human_bytes(end.bytes)}{billed}, {usd(end.usd_month)}/month "
        f"(keeping everything: {human_bytes(keep_end.bytes)}, {usd(keep_end.usd_month)}/month)"
    )
    if result.deleted_billed_usd:
        typer.echo(
            f"deleted bytes still billed by their provider: {usd(result.deleted_billed_usd)} "
            f"of the {usd(result.total_usd)}"
        )
    typer.echo(
        f"over {result.horizon_days} days: {usd(result.total_usd)} "
        f"(fees {usd(result.fees_usd)}); keeping everything: {usd(keep.total_usd)}; "
        f"savings {usd(result.savings_usd)}"
    )
    if result.skipped_demotions:
        typer.echo(
            f"{result.skipped_demotions} demotion(s) per run skipped: early deletion would "
            "cost more than they save"
        )


def render_sizing(result: PlannerRead) -> None:
    if result.checkpoint_bytes is not None:
        per = result.bytes_per_parameter
        typer.echo(
            f"checkpoint size: {human_bytes(result.checkpoint_bytes)}"
            + (f" ({per:g} bytes per parameter)" if per is not None else "")
        )
    if result.write_bandwidth_bytes_per_s is not None:
        typer.echo(f"write bandwidth: {human_bytes(result.write_bandwidth_bytes_per_s)}/s")
    if result.young_daly_interval_s is not None:
        seconds = result.young_daly_interval_s
        typer.echo(f"Young/Daly interval: {seconds:,.0f} s ({seconds / 3600:.2f} h)")
    if result.sync_stall_gpu_hours is not None:
        typer.echo(f"synchronous stall: {result.sync_stall_gpu_hours:,.1f} GPU-hours")
    if result.sync_stall_usd is not None:
        typer.echo(f"synchronous stall cost: {usd(result.sync_stall_usd)}")
    for output, needs in result.incomplete.items():
        typer.echo(f"{output}: also needs {', '.join(needs)}")


def register(cli: typer.Typer) -> None:
    """Add the cost commands to `cli`."""

    @cli.command()
    @connected
    def report(
        remote: Remote,
        group_by: Annotated[
            str, typer.Option("--group-by", help=f"one of {', '.join(GROUPS)}")
        ] = "tier",
        project: Annotated[str | None, typer.Option(help="only this project")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """What the catalog stores and costs a month, trashed checkpoints included."""
        if group_by not in GROUPS:
            raise usage(f"--group-by: one of {', '.join(GROUPS)}, not {group_by!r}")
        params = {"group_by": group_by, "project": project}
        with progress("costing the catalog"):
            body = remote.call(
                "GET",
                "/v1/reports/cost",
                params={k: v for k, v in params.items() if v is not None},
                slow=True,
            )
        if as_json:
            emit_json(body)
            return
        render_report(body)

    @cli.command()
    @connected
    def forecast(
        remote: Remote,
        run_days: Annotated[int, typer.Option(help="length of the run in days")],
        checkpoint_bytes: Annotated[
            float | None, typer.Option(help="bytes per checkpoint, e.g. 1e12")
        ] = None,
        parameters: Annotated[
            float | None, typer.Option(help="model parameters, e.g. 70e9")
        ] = None,
        bytes_per_parameter: Annotated[
            float | None, typer.Option(help="with --parameters; default 14")
        ] = None,
        schedule: Annotated[
            list[str] | None,
            typer.Option(
                help="CLASS=INTERVAL or CLASS=end, repeated (default: the worked example)"
            ),
        ] = None,
        policy: Annotated[
            str, typer.Option(help="a stored policy's name, or a policy YAML file")
        ] = "default",
        concurrent_runs: Annotated[int, typer.Option(help="runs started together")] = 1,
        horizon_days: Annotated[int | None, typer.Option(help="default: run + 30")] = None,
        price: Annotated[
            list[str] | None,
            typer.Option(
                help="TIER=USD per GB-month, or TIER=provider/CLASS; TIER * for every "
                "tier not named"
            ),
        ] = None,
        billed_after_delete: Annotated[
            list[str] | None,
            typer.Option(
                help="TIER=DURATION deleted bytes stay billed (soft delete: hot=7d; 0s for "
                "none), or TIER=forever; TIER * for every tier not named; default: the tiers' "
                "provider settings"
            ),
        ] = None,
        metrics: Annotated[str, typer.Option(help="improving or missing")] = "improving",
        chart: Annotated[Path, typer.Option(help="PNG to write")] = Path("forecast.png"),
        no_chart: Annotated[bool, typer.Option("--no-chart", help="write no PNG")] = False,
        every: Annotated[int, typer.Option(min=1, help="print every Nth day")] = 5,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """What a run (or N runs) will store and cost under a policy, beside keeping
        everything; prints a table and writes a chart."""
        body: dict[str, Any] = {
            "checkpoint_bytes": checkpoint_bytes,
            "parameters": parameters,
            "bytes_per_parameter": bytes_per_parameter,
            "run_days": run_days,
            "schedule": _pairs(list(schedule or DEFAULT_SCHEDULE), "--schedule"),
            "policy": what_if(policy),
            "concurrent_runs": concurrent_runs,
            "horizon_days": horizon_days,
            "metrics": metrics,
            "prices": _prices(list(price or [])) or None,
            "billed_after_delete": _billed(list(billed_after_delete or [])) or None,
        }
        from app.api.cost_schemas import ForecastRead

        ask_and_show(
            remote,
            "/v1/forecast",
            body,
            doing=f"forecasting {horizon_days or run_days + 30} days",
            read=ForecastRead.model_validate,
            table=lambda result: render_forecast_table(result, every),
            draw=render_forecast,
            chart=chart,
            no_chart=no_chart,
            as_json=as_json,
        )

    @cli.command()
    @connected
    def planner(
        remote: Remote,
        parameters: Annotated[
            float | None, typer.Option(help="model parameters, e.g. 70e9")
        ] = None,
        bytes_per_parameter: Annotated[float | None, typer.Option(help="default 14")] = None,
        recipe: Annotated[
            str | None,
            typer.Option(
                help="fp32-master-adam (12), bf16-fp32-master-adam (14), zero-mixed-adam (16)"
            ),
        ] = None,
        checkpoint_bytes: Annotated[
            float | None, typer.Option(help="instead of parameters")
        ] = None,
        interval: Annotated[
            str | None, typer.Option(help="time between checkpoints, e.g. 1h")
        ] = None,
        allowed_overlap: Annotated[
            float | None, typer.Option(help="fraction of training time spent writing, e.g. 0.1")
        ] = None,
        write_seconds: Annotated[
            float | None, typer.Option(help="seconds one checkpoint takes to write")
        ] = None,
        mtbf: Annotated[
            str | None, typer.Option(help="mean time between failures, e.g. 24h")
        ] = None,
        checkpoints: Annotated[
            int | None, typer.Option(help="synchronous saves in the run")
        ] = None,
        gpus: Annotated[int | None, typer.Option(help="GPUs that wait for each save")] = None,
        usd_per_gpu_hour: Annotated[float | None, typer.Option(help="price of a GPU-hour")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Checkpoint size, write bandwidth, Young/Daly interval and synchronous stall cost."""
        body = {
            "parameters": parameters,
            "bytes_per_parameter": bytes_per_parameter,
            "recipe": recipe,
            "checkpoint_bytes": checkpoint_bytes,
            "interval": interval,
            "allowed_overlap": allowed_overlap,
            "checkpoint_write_seconds": write_seconds,
            "mtbf": mtbf,
            "checkpoints": checkpoints,
            "gpus": gpus,
            "usd_per_gpu_hour": usd_per_gpu_hour,
        }
        request = {k: v for k, v in body.items() if v is not None}
        answer = remote.call("POST", "/v1/planner", json=request)
        if as_json:
            emit_json(answer)
            return
        from app.api.planner_schemas import PlannerRead

        render_sizing(PlannerRead.model_validate(answer))
