"""Shared fixtures: every database test runs on SQLite and on a real PostgreSQL.

PostgreSQL is reached at 127.0.0.1:5432 (trust auth, user postgres); the suite creates
and drops its own databases. With CKPT_TEST_REQUIRE_POSTGRES=true (CI) an unreachable
server fails the run instead of skipping the PostgreSQL half.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.db.migrate import upgrade
from app.db.models import Base
from app.db.session import make_engine
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings

PG_HOST = os.environ.get("CKPT_TEST_PG_HOST", "127.0.0.1")
PG_ADMIN_DSN = f"host={PG_HOST} port=5432 user=postgres dbname=postgres"


def postgres_url(dbname: str) -> str:
    return f"postgresql+psycopg://postgres@{PG_HOST}:5432/{dbname}"


def _require_postgres() -> None:
    try:
        psycopg.connect(PG_ADMIN_DSN, connect_timeout=3).close()
    except psycopg.OperationalError as error:
        if os.environ.get("CKPT_TEST_REQUIRE_POSTGRES") == "true":
            pytest.fail(f"PostgreSQL is required but unreachable: {error}")
        pytest.skip(f"PostgreSQL unreachable: {error}")


def create_pg_database() -> str:
    _require_postgres()
    name = f"ckpt_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_pg_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'ckpt.db'}"
        upgrade(url)
        yield url
        return
    name = create_pg_database()
    try:
        url = postgres_url(name)
        upgrade(url)
        yield url
    finally:
        drop_pg_database(name)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clean_engine(engine: Engine) -> Engine:
    """The session's database, emptied before the test."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))
    return engine


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=data_dir,
        policies_dir=data_dir.parent / "policies",
        auth="off",
    )


@pytest.fixture
def app(settings: Settings, clean_engine: Engine) -> FastAPI:
    """No background threads: tests drive evaluations and workers themselves."""
    return create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client
