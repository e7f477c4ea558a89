"""Commands that ask the service one question and draw its answer (`ckpt forecast`,
`ckpt backtest`): the asking, the table or JSON, and the chart, done one way for both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer

from app.cli.chart import MISSING, can_draw
from app.cli.output import emit_json, progress
from app.cli.remote import Remote, usage

A = TypeVar("A")  # the answer, as its response schema reads it


def ask_and_show(
    remote: Remote,
    path: str,
    body: Mapping[str, Any],
    *,
    doing: str,
    read: Callable[[Any], A],
    table: Callable[[A], None],
    draw: Callable[[A, Path], Path],
    chart: Path,
    no_chart: bool,
    as_json: bool,
) -> None:
    """POST `body` (its unset fields left out) to `path`, then show the answer as JSON (as
    it came) or as a table, and write its chart unless `no_chart`. Whether the chart can be
    drawn is checked before asking: no half an answer."""
    if not no_chart and not can_draw():
        raise usage(MISSING)
    request = {k: v for k, v in body.items() if v is not None}
    with progress(doing):
        answer = remote.call("POST", path, json=request, slow=True)
    result = read(answer)
    if as_json:
        emit_json(answer)
    else:
        table(result)
    if not no_chart:
        with progress(f"drawing {chart}"):
            written = draw(result, chart)
        typer.echo(f"chart: {written}", err=as_json)
