"""The `ckpt` command: the service's own processes (serve, api, scheduler, worker, migrate,
which open the database) and everything an operator does to the catalog, over HTTP."""

from __future__ import annotations

import sys

import typer

from app.cli import (
    actions,
    audit,
    backtest,
    checkpoints,
    cost,
    imports,
    lifecycle,
    policies,
    reconcile,
    roles,
    runs,
    serve,
    tokens,
)
from app.cli.remote import root_options

cli = typer.Typer(no_args_is_help=True, callback=root_options)
for commands in (serve, roles, runs, checkpoints, actions, lifecycle, policies, cost, tokens):
    commands.register(cli)
for commands in (audit, reconcile, imports, backtest):
    commands.register(cli)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
