"""The `ckpt` command."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
import uvicorn

from app.cli.cost import register as register_cost_commands
from app.cli.lifecycle import register as register_lifecycle_commands
from app.cli.reconcile import register as register_reconcile_commands
from app.cli.token import register as register_token_commands
from app.db import migrate as migrations
from app.logging import UVICORN_LOG_CONFIG, configure_logging
from app.services.catalog.policies import PolicyFileError, load_policy_files
from app.settings import Settings, SettingsError, load_settings
from app.tiers_config import TiersFileError, load_tiers

cli = typer.Typer(help="Checkpoint retention and lifecycle service.", no_args_is_help=True)
log = logging.getLogger("app.cli")


def _settings() -> Settings:
    """Settings, tiers and policy files checked up front: a bad value stops start-up with
    a message naming the variable, or the file, rule and field."""
    try:
        settings = load_settings()
        tiers = load_tiers(settings)
        load_policy_files(settings.policies_dir, [t.name for t in tiers])
    except (SettingsError, TiersFileError, PolicyFileError) as error:
        typer.echo(f"ckpt: configuration error: {error}", err=True)
        raise typer.Exit(2) from None
    return settings


def _serve(settings: Settings, *, factory: str, workers: int) -> None:
    configure_logging()
    migrations.upgrade(settings.database_url)
    configure_logging()  # alembic's fileConfig-free run may have touched handlers
    log.info(
        "starting",
        extra={"host": settings.host, "port": settings.port, "auth": settings.auth},
    )
    uvicorn.run(
        factory,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_config=UVICORN_LOG_CONFIG,
        access_log=False,
    )


@cli.command()
def serve() -> None:
    """Everything in one process: migrate, then serve the API (embedded default)."""
    _serve(_settings(), factory="app.main:create_app", workers=1)


@cli.command()
def api(
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the API only (production: several replicas on one database)."""
    _serve(_settings(), factory="app.main:create_api_app", workers=workers)


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date."""
    settings = _settings()
    configure_logging()
    migrations.upgrade(settings.database_url)
    typer.echo("database is at the latest schema")


register_lifecycle_commands(cli, _settings)
register_token_commands(cli, _settings)
register_cost_commands(cli, _settings)
register_reconcile_commands(cli, _settings)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
