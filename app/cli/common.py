"""What the commands that are the service (serve, api, scheduler, worker, migrate) share:
settings checked up front, the database brought to the latest schema, the tiers and policy
files loaded, and one way to say what went wrong. Such a command is a job: it owns its
transactions (session_scope). Every other command asks the service (remote.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import typer
from sqlalchemy.orm import Session, sessionmaker

from app.bootstrap import load_policies_into
from app.db import migrate as migrations
from app.db.session import make_engine, make_session_factory
from app.domain.tier import Tier
from app.logging import configure_logging
from app.policy.loading import PolicyFileError, load_policy_files
from app.settings import Settings, SettingsError, load_settings
from app.storage.bucket_settings import BucketSettingsError, detect_all
from app.storage.registry import StorageRegistry
from app.tiers_config import TiersFileError, load_tiers


@dataclass(frozen=True)
class Catalog:
    settings: Settings
    factory: sessionmaker[Session]
    tiers: list[Tier]
    storages: StorageRegistry = field(default_factory=StorageRegistry)  # built on first use


def checked_settings() -> Settings:
    """Settings, tiers and policy files checked up front: a bad value stops start-up with
    a message naming the variable, or the file, rule and field."""
    try:
        settings = load_settings()
        tiers = load_tiers(settings)
        load_policy_files(settings.policies_dir, [t.name for t in tiers])
        if any(tier.detect for tier in tiers):  # a bucket that contradicts its tier
            detect_all(tiers, StorageRegistry().storage_for)
    except (SettingsError, TiersFileError, PolicyFileError, BucketSettingsError) as error:
        typer.echo(f"ckpt: configuration error: {error}", err=True)
        raise typer.Exit(2) from None
    return settings


def open_database(settings: Settings, *, pool_size: int | None = None) -> sessionmaker[Session]:
    """The database at the latest schema, quiet logs (a command's output is its answer)."""
    configure_logging("WARNING")
    migrations.upgrade(settings.database_url)
    if pool_size is None:
        return make_session_factory(make_engine(settings.database_url))
    return make_session_factory(make_engine(settings.database_url, pool_size=pool_size))


def open_catalog(
    settings: Settings, *, policies: bool = True, pool_size: int | None = None
) -> Catalog:
    """Settings, database and tiers; with `policies`, the policy files stored first (as
    every replica reads them), a bad file stopping the command with its reason."""
    factory = open_database(settings, pool_size=pool_size)
    tiers = load_tiers(settings)
    if policies:
        try:
            load_policies_into(factory, settings, tiers)
        except PolicyFileError as error:
            raise fail(str(error)) from None
    return Catalog(settings, factory, tiers)


def fail(message: str, code: int = 2) -> typer.Exit:
    """`ckpt: <message>` on stderr; raise what it returns."""
    typer.echo(f"ckpt: {message}", err=True)
    return typer.Exit(code)
