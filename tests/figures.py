"""Figures a test run reports about itself (crash injections covered, actions run, faults
injected): tests add them with `record_property(FIGURES, "...")`, which pytest-xdist carries
back from its workers, and the run prints them at its end (tests/conftest.py). The figures in
docs/reliability.md are copied from there."""

from __future__ import annotations

import pytest

FIGURES = "figures"


def print_figures(terminalreporter: pytest.TerminalReporter) -> None:
    lines = sorted(
        str(value)
        for report in terminalreporter.stats.get("passed", [])
        for key, value in getattr(report, "user_properties", [])
        if key == FIGURES
    )
    if not lines:
        return
    terminalreporter.section("figures of this run")
    for line in lines:
        terminalreporter.line(line)
    crash = [line for line in lines if line.startswith("crash injection:")]
    if crash:
        injections = sum(int(line.split(": ", 2)[2].split(" injections")[0]) for line in crash)
        terminalreporter.line(
            f"crash injection in all: {injections} kills over {len(crash)} scenarios"
        )
