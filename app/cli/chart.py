"""A forecast, as the service answered it, as a picture: bytes per tier over time under the
policy (stacked), the bytes of keeping everything, and both monthly costs on a second axis;
and a backtest: the candidate against what was actually stored. PNG, no display needed."""

from __future__ import annotations

import importlib.util
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from app.api.backtest import BacktestRead
    from app.api.cost_schemas import ForecastRead

TB = 10**12
MISSING = (
    "the chart needs matplotlib, which the service does not install: "
    "pip install 'ckpt-lifecycle[chart]', or pass --no-chart"
)


def can_draw() -> bool:
    """Whether matplotlib is installed (the `chart` extra): the server never needs it."""
    return importlib.util.find_spec("matplotlib") is not None


def render_forecast(forecast: ForecastRead, path: Path) -> Path:
    """Write the chart of `forecast` to `path` (PNG) and return the path."""
    policy, keep = forecast, forecast.keep_everything
    days = [point.day for point in policy.series]
    tiers = list(policy.series[0].bytes_by_tier) if policy.series else []
    stacks = [[p.bytes_by_tier.get(t, 0) / TB for p in policy.series] for t in tiers]
    figure, axes = _figure()
    shown = [(t, s) for t, s in zip(tiers, stacks, strict=True) if any(s)]
    if shown:
        axes.stackplot(days, *[s for _t, s in shown], labels=[f"on {t}" for t, _s in shown])
    axes.plot(
        days,
        [p.bytes / TB for p in keep.series],
        color="black",
        linewidth=1.5,
        label=f"keep everything (on {tiers[0] if tiers else 'the hottest tier'})",
    )
    axes.set_xlabel("day")
    axes.set_ylabel("stored (TB)")
    axes.set_xlim(left=min(days, default=0), right=max(days, default=1))
    axes.set_ylim(bottom=0)
    run_end = forecast.run_days
    axes.axvline(run_end, color="grey", linestyle=":", linewidth=1)
    axes.annotate("run ends", (run_end, 0), xytext=(3, 3), textcoords="offset points")
    _costs(
        axes,
        days,
        ("$/month, policy", [p.usd_month for p in policy.series]),
        ("$/month, keep everything", [p.usd_month for p in keep.series]),
    )
    runs = forecast.concurrent_runs
    axes.set_title(
        f"{forecast.policy}: {runs} run{'s' if runs != 1 else ''} of "
        f"{forecast.run_days} days, {forecast.checkpoint_bytes / TB:g} TB checkpoints; "
        f"saves ${forecast.savings_usd:,.0f} over {forecast.horizon_days} days"
    )
    return _save(figure, path)


def render_backtest(result: BacktestRead, path: Path) -> Path:
    """The candidate's bytes against what was actually stored, day by day, and both monthly
    costs on a second axis; the days of regrets marked. PNG."""
    first = result.series[0].day if result.series else date.today()
    days = [(p.day - first).days for p in result.series]
    figure, axes = _figure()
    axes.plot(days, [p.bytes / TB for p in result.series], label=f"{result.policy} (candidate)")
    axes.plot(days, [p.bytes / TB for p in result.actual.series], color="black", label="actual")
    for regret in result.regrets:
        used = (regret.used_at.date() - first).days
        axes.axvline(used, color="tab:orange", linewidth=0.8)
    axes.set_xlabel(f"days since {first.isoformat()}")
    axes.set_ylabel("stored (TB)")
    axes.set_ylim(bottom=0)
    _costs(
        axes,
        days,
        ("$/month", [p.usd_month for p in result.series]),
        ("$/month, actual", [p.usd_month for p in result.actual.series]),
    )
    axes.set_title(
        f"{result.policy} against what happened: saves ${result.savings_usd:,.2f}; "
        f"{len(result.regrets)} regret(s) (orange: when used)"
    )
    return _save(figure, path)


def _figure() -> tuple[Figure, Axes]:
    # Imported here: plotting is the slow import of the package and only a chart needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _costs(
    axes: Axes, days: list[int], ours: tuple[str, list[float]], theirs: tuple[str, list[float]]
) -> None:
    """Both monthly costs on a second axis (ours solid, the comparison dashed), and one
    legend for both axes."""
    cost = axes.twinx()
    cost.plot(days, ours[1], color="tab:red", label=ours[0])
    cost.plot(days, theirs[1], color="tab:red", linestyle="--", label=theirs[0])
    cost.set_ylabel("cost (USD per month)")
    cost.set_ylim(bottom=0)
    handles, labels = axes.get_legend_handles_labels()
    more, more_labels = cost.get_legend_handles_labels()
    axes.legend(handles + more, labels + more_labels, loc="upper left", fontsize="small")


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
