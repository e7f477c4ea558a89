"""Shared fixtures: every database test runs on SQLite and on a real PostgreSQL.

PostgreSQL is reached at 127.0.0.1:5432 (trust auth, user postgres); the suite creates
and drops its own databases. With CKPT_TEST_REQUIRE_POSTGRES=true (CI) an unreachable
server fails the run instead of skipping the PostgreSQL half.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, and_, select, text

from app.db.migrate import upgrade
from app.db.models import Base, Checkpoint, Location
from app.db.session import make_engine
from app.logging import JsonFormatter
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import SECRETS, issue_token, token_client
from tests.figures import print_figures

# The S3 and GCS test servers, one of each per test process, and the catalog service the
# `ckpt` command's tests talk to. Fixtures imported into
# several modules would each be a fixture of their own: a server (and an emulator host)
# per module.
pytest_plugins = [
    "tests.storage.gcs_server",
    "tests.storage.s3_servers",
    "tests.integration.cli_service",
]

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


def migrated_database(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A new database of `kind` (`sqlite` or `postgresql`) at the latest schema, built by
    the migrations; a PostgreSQL one is dropped when the caller is done with it."""
    if kind == "sqlite":
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


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield from migrated_database(request.param, tmp_path_factory)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clean_engine(engine: Engine) -> Iterator[Engine]:
    """The session's database, emptied before the test (`empty`); after it, every
    checkpoint's row must still name its primary location's tier."""
    empty(engine)
    yield engine
    assert tiers_out_of_step(engine) == []


def tiers_out_of_step(engine: Engine) -> list[tuple[str, str | None, str | None]]:
    """Checkpoints whose row's tier (what a plan reads) is not their primary location's
    (what a worker acts on; None without one): (id, the row's, the primary's). Every
    test that writes through the service checks this when it ends, so a write that moves
    one without the other fails the test that made it."""
    on_primary = and_(Location.checkpoint_id == Checkpoint.id, Location.role == "primary")
    stmt = (
        select(Checkpoint.id, Checkpoint.tier, Location.tier)
        .outerjoin(Location, on_primary)
        .where(Checkpoint.tier.is_distinct_from(Location.tier))
    )
    with engine.connect() as conn:
        return [(cid, row_tier, primary) for cid, row_tier, primary in conn.execute(stmt)]


def empty(engine: Engine) -> None:
    """Delete every row, its sequences started again.

    DELETE, children first, rather than TRUNCATE: a test leaves a few rows, and on
    PostgreSQL TRUNCATE of every table costs about 50 ms (it rewrites each relation) where
    these DELETEs and sequence restarts cost about 2. A transaction rolled back per test is
    not an option: the code under test commits on connections of its own (the job owners),
    and other processes (workers, commands) must see what a test wrote."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        for table in tables:
            conn.execute(text(f"DELETE FROM {table}"))
        if conn.dialect.name == "postgresql":
            sequences = conn.execute(
                text("SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()")
            ).scalars()
            for sequence in sequences:
                conn.execute(text(f'ALTER SEQUENCE "{sequence}" RESTART'))


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


# --- access control -------------------------------------------------------------------------


@pytest.fixture
def auth_settings(settings: Settings) -> Settings:
    """The test settings with access control on, as in production."""
    return settings.model_copy(update={"auth": "on"})


@pytest.fixture
def auth_app(auth_settings: Settings, clean_engine: Engine) -> FastAPI:
    return create_app(auth_settings, engine=clean_engine, roles=NO_BACKGROUND)


@pytest.fixture
def auth_client(auth_app: FastAPI) -> Iterator[TestClient]:
    """A client of the auth-on app that sends no token; it runs the app's lifespan."""
    with TestClient(auth_app) as test_client:
        yield test_client


@pytest.fixture
def admin_secret(auth_app: FastAPI) -> str:
    return issue_token(auth_app, name="admin", scopes=("admin",))[1]


@pytest.fixture
def admin_client(auth_client: TestClient, auth_app: FastAPI, admin_secret: str) -> TestClient:
    """The auth-on app as an admin token (auth_client keeps the lifespan running)."""
    return token_client(auth_app, admin_secret)


# Loggers whose records the whole run keeps: the app's own at every level, the libraries'
# at whatever level they emit (a handler on a parent sees its children's records).
CAPTURED_LOGGERS = ("app", "uvicorn", "fastapi", "starlette", "httpx", "sqlalchemy", "alembic")


class _LogSink(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.formatter_ = JsonFormatter()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.formatter_.format(record))
        except Exception:  # a record that cannot be formatted is still a line to search
            self.lines.append(f"{record.msg!r} {record.args!r}")


@pytest.fixture(scope="session", autouse=True)
def no_secret_in_any_log() -> Iterator[_LogSink]:
    """Every log line of the run, searched at its end for every token secret the tests made
    (a leak fails the run, as an error of the last test)."""
    sink = _LogSink()
    app_logger = logging.getLogger("app")
    level = app_logger.level
    app_logger.setLevel(logging.DEBUG)
    for name in CAPTURED_LOGGERS:
        logging.getLogger(name).addHandler(sink)
    yield sink
    for name in CAPTURED_LOGGERS:
        logging.getLogger(name).removeHandler(sink)
    app_logger.setLevel(level)
    leaked = [
        line.replace(secret, "<secret>")
        for line in sink.lines
        for secret in SECRETS
        if secret and secret in line
    ]
    assert not leaked, f"token secrets in {len(leaked)} log lines, e.g. {leaked[0][:300]}"


# The longest modules, started first, longest first (seconds of one run, Dec 2026): with
# `-n 2 --dist loadfile --no-loadscope-reorder` (the Makefile's) the files are handed out in
# collection order, each to whichever worker is free. xdist's own order, by number of tests,
# started the one-test, two-minute concurrency module last: one worker ran it alone for
# over a minute at the end of the run.
LONGEST_FIRST = (
    "tests/frameworks/test_dcp.py",  # 130 s
    "tests/reliability/test_many_processes.py",  # 113 s
    "tests/reliability/test_crash.py",  # 100 s
    "tests/client/test_outage_next_call.py",  # 86 s
    "tests/frameworks/test_lightning.py",  # 74 s
    "tests/integration/test_shadow_equivalence.py",  # 65 s
    "tests/frameworks/test_transformers.py",  # 62 s
    "tests/client/test_outage_flush.py",  # 58 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST, then the other modules by their number of tests, most first (what
    xdist's reordering does): the many short ones even out the two workers' ends."""
    counts: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        counts[path] = counts.get(path, 0) + 1

    def rank(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path), 0
        return len(LONGEST_FIRST), -counts[path]

    items.sort(key=rank)  # stable: the order within each module, and among equals, is kept


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    print_figures(terminalreporter)
