"""Alembic environment: the URL comes from the caller's config or CKPT_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from app.db.models import Base
from app.db.session import make_engine
from app.settings import load_settings

config = context.config
target_metadata = Base.metadata
# Every process upgrades the schema at start (`ckpt serve|api|scheduler|worker`); on
# PostgreSQL they take turns, so replicas starting together never run a migration twice.
MIGRATION_LOCK_KEY = 0x636B7074_6D696772  # "ckptmigr"


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Held until this transaction ends; the next process then finds the schema at
            # head and has nothing to do.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or load_settings().database_url
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or load_settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
