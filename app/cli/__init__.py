"""The `ckpt` command: serve, run background roles, and operate the catalog by hand."""

from __future__ import annotations

import sys

import typer

from app.cli import cost, lifecycle, reconcile, serve, token

cli = typer.Typer(help="Checkpoint retention and lifecycle service.", no_args_is_help=True)
for commands in (serve, lifecycle, token, cost, reconcile):
    commands.register(cli)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
