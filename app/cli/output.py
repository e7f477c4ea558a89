"""How every `ckpt` command shows its results, kept apart from how it gets them.

- Tables go to stdout and fit the terminal's width (`COLUMNS` when set, else 80 off a
  terminal): when they would not fit, the least important columns are left out, and free-text
  columns wrap at word boundaries. An id is never cut, so it can be copied into the next
  command; the full row is always available with `--json`.
- `--json` documents go to stdout alone, so `ckpt ... --json | jq` needs no filtering.
- Progress goes to stderr, and only when stderr is a terminal: piped or captured output is
  exactly what it was without it.

Commands hand plain values (strings, lists of rows) to these functions; whether the values
came from the database or over HTTP is no concern of this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

Role = Literal["id", "value", "text"]
TEXT_MIN_WIDTH = 20  # narrower than this, a reason reads one word per line


def stdout() -> Console:
    """A console on stdout made when needed, so it sees the current `COLUMNS` and stream."""
    return Console()


def stderr() -> Console:
    return Console(stderr=True)


def human_bytes(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} PB"  # pragma: no cover


def usd(amount: float) -> str:
    return f"${amount:,.2f}"


def moment(value: datetime | None) -> str:
    """A timestamp to the minute, for a table cell (`--json` keeps the exact value)."""
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else ""


def moment_text(iso: str | None) -> str:
    """An ISO 8601 timestamp of an answer, to the minute, for a table cell."""
    if not iso:
        return ""
    try:
        return moment(datetime.fromisoformat(iso.replace("Z", "+00:00")))
    except ValueError:
        return iso


def emit_json(document: Any) -> None:
    """`document` as indented JSON on stdout, and nothing else."""
    typer.echo(json.dumps(document, indent=2))


# --- tables --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """A table column. `role`: `id` is shown whole on one line, `value` (short figures and
    names) on one line, `text` (reasons) wraps. `drop`: 0 is always shown; when the table
    is too wide, the column with the highest `drop` goes first (empty columns before any)."""

    header: str
    role: Role = "value"
    drop: int = 0
    justify: Literal["left", "right"] = "left"


def _natural(header: str, cells: Sequence[str]) -> int:
    widest = max((cell_len(line) for cell in cells for line in cell.splitlines()), default=0)
    return max(cell_len(header), widest)


def _needed(column: Column, natural: int) -> int:
    return min(natural, TEXT_MIN_WIDTH) if column.role == "text" else natural


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """The indices of the columns to show in `width` cells: every column when it fits, else
    without the most droppable ones. Ids and free text at its minimum width must fit; the
    rest of the line is left to the text columns."""
    naturals = [_natural(c.header, [row[i] for row in rows]) for i, c in enumerate(columns)]
    empty = {i for i in range(len(columns)) if not any(row[i] for row in rows)}
    shown = list(range(len(columns)))

    def total() -> int:  # cell contents, one space of padding each side, the rules between
        return sum(_needed(columns[i], naturals[i]) for i in shown) + 3 * len(shown) + 1

    droppable = sorted(
        (i for i in shown if columns[i].drop > 0),
        key=lambda i: (i in empty, columns[i].drop, i),
        reverse=True,
    )
    for index in droppable:
        if total() <= width:
            break
        shown.remove(index)
    return shown


def build_table(
    title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int
) -> Table:
    """A table of the columns that fit in `width` (see `fit_columns`)."""
    shown = fit_columns(columns, rows, width)
    table = Table(title=title)
    for i in shown:
        column = columns[i]
        natural = _natural(column.header, [row[i] for row in rows])
        if column.role == "text":
            table.add_column(
                column.header, justify=column.justify, min_width=_needed(column, natural)
            )
        else:
            table.add_column(column.header, justify=column.justify, no_wrap=True, min_width=natural)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def table_width(table: Table) -> int:
    """What `table` needs at least: its fixed columns whole and its text at minimum width."""
    return sum(c.min_width or 0 for c in table.columns) + 3 * len(table.columns) + 1


def print_table(
    title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]]
) -> None:
    """Print a table on stdout that fits the terminal. On a terminal too narrow even for the
    ids, the lines run past its edge rather than cut one."""
    console = stdout()
    table = build_table(title, columns, rows, width=console.width)
    needed = table_width(table)
    if needed > console.width:
        console = Console(width=needed)
    console.print(table)


# --- progress ------------------------------------------------------------------------------


class Tick:
    """What a command reports while it works: what it is doing and, when known, how far."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, steps)

    def update(self, *, completed: float, total: float | None, description: str) -> None:
        """Where a wait stands: `completed` of `total` (None: not known yet)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, completed=completed, total=total, description=description
            )


class _Count(ProgressColumn):
    """`done/total` when the total is known, `done` while counting, nothing before."""

    def render(self, task: Task) -> Text:
        if task.total is not None:
            return Text(f"{int(task.completed)}/{int(task.total)}")
        return Text(str(int(task.completed)) if task.completed else "")


@contextmanager
def progress(description: str, *, total: int | None = None) -> Iterator[Tick]:
    """What the block is doing on stderr while it runs: a spinner, a bar (pulsing until a
    `total` is known), the count advanced so far and the time taken. Drawn at once, so even
    a quick command shows it, and cleared at the end. Off a terminal it draws nothing."""
    console = stderr()
    if not console.is_terminal:
        yield Tick(None, None)
        return
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        _Count(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task(description, total=total)  # before the start, so the first frame has it
    with bar:
        yield Tick(bar, task)


def usd_text(amount: float, *, signed: bool = False) -> str:
    """`$1,234.57`, or `-$1,234.57` / `+$0.05` when `signed`; an amount under a cent keeps
    two significant digits (`$2.3e-05`) rather than print as $0.00."""
    if amount == 0:
        return "$0.00"
    sign = ("-" if amount < 0 else "+") if signed else ""
    size = abs(amount)
    return f"{sign}${size:,.2f}" if size >= 0.01 else f"{sign}${size:.2g}"
