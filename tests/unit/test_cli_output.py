"""Tables that fit the terminal: columns chosen by width, ids never cut, reasons in whole
lines. Rendered by rich exactly as the `ckpt` command renders them, into a string."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console

from app.cli.output import TEXT_MIN_WIDTH, Column, build_table, fit_columns, table_width

COLUMNS = (
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
REASON = "rolling-keep-3: keep_last 3 (newest 3 of class rolling); this one is number 7"


def ckpt_id(n: int) -> str:
    return f"ckpt_019ad3f0c2ab4e5f6a7b8c9d0e{n:02d}"  # as long as a real one


def rows(n: int = 4, *, to: str = "") -> list[tuple[str, ...]]:
    return [
        (str(i), ckpt_id(i), "delete", "hot", to, "1.2 GB", "pending", "default/keep-3", REASON)
        for i in range(n)
    ]


def render(width: int, data: list[tuple[str, ...]]) -> list[str]:
    """What `print_table` prints on a terminal `width` cells wide."""
    out = io.StringIO()
    table = build_table("plan", COLUMNS, data, width=width)
    console = Console(file=out, width=max(width, table_width(table)), color_system=None)
    console.print(table)
    return out.getvalue().splitlines()


def test_at_80_columns_every_id_is_whole_and_no_line_is_wider() -> None:
    lines = render(80, rows())

    assert max(cell_len(line) for line in lines) <= 80
    for i in range(4):
        assert sum(ckpt_id(i) in line for line in lines) == 1


def test_at_80_columns_the_reason_wraps_as_lines_not_words() -> None:
    lines = render(80, rows())

    reason_lines = [line for line in lines if "rolling-keep-3" in line]
    assert reason_lines
    header = next(line for line in lines if "reason" in line)
    cell = header[header.index("reason") - 1 :].split("┃")[0]
    assert cell_len(cell) >= TEXT_MIN_WIDTH


def test_least_important_and_empty_columns_go_first() -> None:
    narrow = [COLUMNS[i].header for i in fit_columns(COLUMNS, rows(), 80)]
    with_targets = [COLUMNS[i].header for i in fit_columns(COLUMNS, rows(to="archive"), 80)]

    assert narrow == ["step", "checkpoint", "kind", "reason"]  # `to` is empty: dropped first
    assert "to" in with_targets and "rule" not in with_targets and "from" not in with_targets


def test_a_wide_terminal_shows_every_column_on_one_line_per_row() -> None:
    lines = render(250, rows())

    header = next(line for line in lines if "checkpoint" in line)
    for column in COLUMNS:
        assert column.header in header
    assert sum(REASON in line for line in lines) == 4


def test_too_narrow_for_the_ids_the_lines_run_on_rather_than_cut_one() -> None:
    lines = render(30, rows(2))

    for i in range(2):
        assert any(ckpt_id(i) in line for line in lines)
