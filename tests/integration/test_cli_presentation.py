"""What a person sees from `ckpt`, against a real service: progress while a command works
when stderr is a terminal (a real pseudo-terminal) and not a byte of it when piped; `--json`
that carries what the table shows; tables that fit 80 columns with every id whole."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
from dataclasses import dataclass

import pytest
from rich.cells import cell_len
from sqlalchemy import select as sql_select

from app.db.models import Action, Sweep
from tests.integration.cli_service import CKPT, Service

CHECKPOINT_ID = re.compile(r"ckpt_[0-9a-f]{28}")
# Settings of the calling environment that would tell rich to draw, or not, regardless
TERMINAL_OVERRIDES = ("FORCE_TERMINAL", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")


@dataclass
class OnTerminal:
    returncode: int
    stdout: str
    terminal: str  # everything written to the pseudo-terminal, control sequences included


def on_terminal(catalog: Service, *args: str) -> OnTerminal:
    """`ckpt ARGS` with stderr on a 100x24 pseudo-terminal and stdout on a pipe; against
    the service, or with the database for the roles that open it (`worker`)."""
    serving = args[0] == "worker"
    env = catalog.database_env() if serving else catalog.env()
    env = {k: v for k, v in env.items() if k not in TERMINAL_OVERRIDES}
    env["TERM"] = "xterm-256color"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(
        [str(CKPT), *(args if serving else catalog.args(args, None))],
        cwd=catalog.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    written = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                process.kill()
                pytest.fail(f"ckpt {' '.join(args)} wrote nothing for 60 s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not chunk:
                break
            written += chunk
        assert process.stdout is not None
        stdout = process.stdout.read().decode()
        returncode = process.wait(timeout=60)
    finally:
        os.close(master)
        if process.stdout is not None:
            process.stdout.close()
    return OnTerminal(returncode, stdout, written.decode(errors="replace"))


def visible(terminal: str) -> str:
    """The text of a terminal transcript without its control sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", terminal)


@pytest.mark.parametrize(
    ("sweep_first", "args", "doing"),
    [
        (False, ("sweep",), "sweeping"),
        (False, ("plan", "--json"), "planning the catalog"),
        (True, ("worker", "--once"), "executing due actions"),
        (False, ("report",), "costing the catalog"),
        (False, ("reconcile",), "tiers with the catalog"),
        (False, ("reconcile", "delete-orphans", "--all"), "then deleting orphans"),
    ],
)
def test_progress_on_a_terminal_and_none_when_piped(
    catalog: Service, sweep_first: bool, args: tuple[str, ...], doing: str
) -> None:
    if sweep_first:
        assert catalog.invoke("sweep").exit_code == 0

    shown = on_terminal(catalog, *args)
    piped = catalog.serving(*args) if args[0] == "worker" else catalog.ckpt(*args)

    assert shown.returncode == 0, shown.terminal
    assert doing in visible(shown.terminal)
    assert "\x1b[" in shown.terminal  # drawn in place, then cleared
    assert doing not in shown.stdout
    if args[0] == "plan":  # stdout stays machine-readable while stderr draws
        assert {a["step"] for a in json.loads(shown.stdout)["actions"]} == {1, 2}
    if args[0] == "worker":  # it counts what it has done, and says so on stdout as ever
        assert re.search(r"executing due actions.* 2 ", visible(shown.terminal))
        assert shown.stdout == "2 actions executed\n"
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""
    assert doing not in piped.stdout
    assert "\x1b" not in piped.stdout


# --- --json carries what the table shows -------------------------------------------------


def test_sweep_dry_run_json_carries_the_table_s_actions(catalog: Service) -> None:
    table = catalog.invoke("sweep", "--dry-run", columns=80)
    document = catalog.invoke("sweep", "--dry-run", "--json")

    assert table.exit_code == 0 and document.exit_code == 0, (table.output, document.output)
    plan = json.loads(document.stdout)
    listed = {a["checkpoint_id"]: a for a in plan["actions"]}
    assert sorted(listed) == sorted(catalog.ckpts[s]["id"] for s in (1, 2))
    assert set(CHECKPOINT_ID.findall(table.stdout)) == set(listed)
    assert f"{len(listed)} planned actions" in table.stdout
    assert {a["kind"] for a in listed.values()} == {"delete"}
    assert {a["step"] for a in listed.values()} == {1, 2}
    assert plan["totals"]["deleted_bytes_by_tier"] == {"hot": 2 * catalog.ckpts[1]["size_bytes"]}
    assert catalog.actions() == []


def test_sweep_json_names_the_sweep_and_the_actions_it_wrote(catalog: Service) -> None:
    result = catalog.invoke("sweep", "--json")

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    with catalog.engine.connect() as conn:
        sweeps = conn.execute(sql_select(Sweep.id)).scalars().all()
        written = conn.execute(sql_select(Action.id, Action.sweep_id)).all()
    assert document == {"sweep_id": sweeps[0], "action_ids": document["action_ids"]}
    assert sorted(document["action_ids"]) == sorted(a for a, _ in written)
    assert {s for _, s in written} == {document["sweep_id"]} and len(written) == 2
    again = json.loads(catalog.invoke("sweep", "--json").stdout)
    assert again["action_ids"] == []


# --- 80 columns ------------------------------------------------------------------------------


def test_plan_at_80_columns_keeps_every_id_whole(catalog: Service) -> None:
    result = catalog.invoke("plan", "--kept", columns=80)

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert sorted(CHECKPOINT_ID.findall(result.stdout)) == sorted(
        c["id"] for c in catalog.ckpts.values()
    )
    assert "…" not in result.stdout
    header = next(line for line in lines if "checkpoint" in line and "reason" in line)
    assert "kind" in header and "rule" not in header  # the least important went first
    reasons = [line.split("│")[-2].strip() for line in lines if line.startswith("│")]
    assert all(" " in r for r in reasons if r), reasons  # lines of words, not one word a line


def test_plan_on_a_wide_terminal_shows_every_column(catalog: Service) -> None:
    result = catalog.invoke("plan", columns=250)

    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "checkpoint" in line)
    for column in ("step", "kind", "from", "to", "bytes", "state", "rule", "reason"):
        assert column in header
    row = next(line for line in result.stdout.splitlines() if catalog.ckpts[1]["id"] in line)
    assert "default/rolling-keep-3" in row and "keep_last 3" in row


def test_restore_wait_draws_its_wait_on_a_terminal_only(catalog: Service) -> None:
    """No worker runs, so the wait ends at --max-wait; meanwhile the bar says what it
    waits for on the terminal, and a pipe gets only the one-line verdict."""
    args = ("checkpoints", "restore", catalog.ckpts[5]["id"], "--tier", "cold", "--wait",
            "--max-wait", "1.5")  # fmt: skip

    shown = on_terminal(catalog, *args)
    piped = catalog.ckpt(*args)

    assert shown.returncode == 1, shown.terminal
    assert "restoring" in visible(shown.terminal) and "\x1b[" in shown.terminal
    assert "restoring" not in shown.stdout
    assert piped.returncode == 1
    [line] = piped.stderr.splitlines()
    assert line.startswith("ckpt: restore act_") and line.endswith("did not finish: it is pending")
