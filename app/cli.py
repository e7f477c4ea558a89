"""The `ckpt` command."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
import uvicorn

from app.db import migrate as migrations
from app.logging import UVICORN_LOG_CONFIG, configure_logging
from app.settings import Settings, SettingsError, load_settings
from app.tiers import TiersFileError, load_tiers

cli = typer.Typer(help="Checkpoint retention and lifecycle service.", no_args_is_help=True)
log = logging.getLogger("app.cli")


def _settings() -> Settings:
    """Settings and tiers checked up front: a bad value stops start-up with its name."""
    try:
        settings = load_settings()
        load_tiers(settings)
    except (SettingsError, TiersFileError) as error:
        typer.echo(f"ckpt: configuration error: {error}", err=True)
        raise typer.Exit(2) from None
    return settings


def _serve(settings: Settings, *, workers: int) -> None:
    configure_logging()
    migrations.upgrade(settings.database_url)
    configure_logging()  # alembic's fileConfig-free run may have touched handlers
    log.info(
        "starting",
        extra={"host": settings.host, "port": settings.port, "auth": settings.auth},
    )
    uvicorn.run(
        "app.main:create_app",
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
    _serve(_settings(), workers=1)


@cli.command()
def api(
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the API only (production: several replicas on one database)."""
    _serve(_settings(), workers=workers)


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date."""
    settings = _settings()
    configure_logging()
    migrations.upgrade(settings.database_url)
    typer.echo("database is at the latest schema")


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
