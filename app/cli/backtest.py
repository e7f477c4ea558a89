"""`ckpt backtest`: what a candidate policy would have done to the runs the catalog had,
beside what actually happened, asked of the service (`POST /v1/backtest`, which reads the
history); the comparison and the regrets are printed here and the chart drawn here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli.answers import ask_and_show
from app.cli.chart import render_backtest
from app.cli.lifecycle import what_if
from app.cli.output import Column, human_bytes, print_table, usd_text
from app.cli.remote import Remote, connected

if TYPE_CHECKING:
    from app.api.backtest import BacktestRead


def render_backtest_table(result: BacktestRead, every: int) -> None:
    columns = (
        Column("day"),
        Column("candidate", justify="right"),
        Column("$/month", justify="right"),
        Column("actual", justify="right"),
        Column("$/month (actual)", justify="right"),
    )
    days = list(zip(result.series, result.actual.series, strict=True))
    rows = [
        (c.day.isoformat(), human_bytes(c.bytes), usd_text(c.usd_month), human_bytes(a.bytes),
         usd_text(a.usd_month))
        for i, (c, a) in enumerate(days)
        if i % every == 0 or i == len(days) - 1
    ]  # fmt: skip
    title = f"backtest: policy {result.policy}, {result.runs} run(s), {result.since:%Y-%m-%d} .. "
    print_table(title + f"{result.until:%Y-%m-%d}", columns, rows)
    typer.echo(
        f"storage over the window: {usd_text(result.total_usd)} under {result.policy}, "
        f"{usd_text(result.actual.total_usd)} actually; "
        f"savings {usd_text(result.savings_usd, signed=True)}"
    )
    if not result.regrets:
        typer.echo("regrets: none (nothing it would have removed was used again)")
        return
    print_table(
        f"regrets: {len(result.regrets)} checkpoint(s) it would have removed were used again",
        (
            Column("checkpoint", role="id"),
            Column("run", role="id", drop=2),
            Column("step", justify="right"),
            Column("would", drop=1),
            Column("on"),
            Column("used"),
            Column("how"),
        ),
        [
            (
                r.checkpoint_id,
                r.run_id,
                str(r.step),
                r.action if r.to_tier is None else f"move to {r.to_tier}",
                f"{r.would_delete_at:%Y-%m-%d %H:%M}",
                f"{r.used_at:%Y-%m-%d %H:%M}",
                r.use,
            )
            for r in result.regrets
        ],
    )


def register(cli: typer.Typer) -> None:
    @cli.command()
    @connected
    def backtest(
        remote: Remote,
        policy: Annotated[str, typer.Option(help="a stored policy's name, or a policy YAML file")],
        project: Annotated[str | None, typer.Option(help="only this project")] = None,
        run_id: Annotated[str | None, typer.Option(help="only this run")] = None,
        since: Annotated[str | None, typer.Option(help="ISO 8601; default: the beginning")] = None,
        until: Annotated[str | None, typer.Option(help="ISO 8601; default: now")] = None,
        chart: Annotated[Path, typer.Option(help="PNG to write")] = Path("backtest.png"),
        no_chart: Annotated[bool, typer.Option("--no-chart", help="write no PNG")] = False,
        every: Annotated[int, typer.Option(min=1, help="print every Nth day")] = 7,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    ) -> None:
        """Replay the catalog's history under a candidate policy: bytes and $/month day by
        day beside what actually happened, and the checkpoints it would have removed that
        people then used (regrets); prints tables and writes a chart."""
        from app.api.backtest import BacktestRead

        body: dict[str, Any] = {
            "policy": what_if(policy),
            "project": project,
            "run_id": run_id,
            "since": since,
            "until": until,
        }
        ask_and_show(
            remote,
            "/v1/backtest",
            body,
            doing="replaying the catalog's history",
            read=BacktestRead.model_validate,
            table=lambda result: render_backtest_table(result, every),
            draw=render_backtest,
            chart=chart,
            no_chart=no_chart,
            as_json=as_json,
        )
