"""`ckpt serve`, `ckpt api`, `ckpt migrate`: the service itself (the worker and scheduler
roles are in roles.py). What only they need (uvicorn, the database, alembic) is imported
when they run, so that the commands that talk to the service over HTTP start quickly."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from app.logging import UVICORN_LOG_CONFIG, configure_logging

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger("app.cli")


def _checked_settings() -> Settings:
    from app.cli.common import checked_settings

    return checked_settings()


def _serve(settings: Settings, *, factory: str, workers: int) -> None:
    import uvicorn

    from app.db import migrate as migrations

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


def register(cli: typer.Typer) -> None:
    """Add the commands that run the service to `cli`."""

    @cli.command()
    def serve() -> None:
        """Everything in one process: migrate, then serve the API (embedded default)."""
        _serve(_checked_settings(), factory="app.main:create_app", workers=1)

    @cli.command()
    def api(
        workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
    ) -> None:
        """Serve the API only (production: several replicas on one database)."""
        _serve(_checked_settings(), factory="app.main:create_api_app", workers=workers)

    @cli.command()
    def migrate() -> None:
        """Bring the database schema up to date."""
        from app.db import migrate as migrations

        settings = _checked_settings()
        configure_logging()
        migrations.upgrade(settings.database_url)
        typer.echo("database is at the latest schema")
