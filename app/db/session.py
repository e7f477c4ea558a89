"""Engines and the transaction boundary: services flush, the caller commits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # The driver would begin transactions only before writes, so the reads of one
    # transaction could see different snapshots; we issue BEGIN ourselves instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _sqlite_begin(connection: Any) -> None:
    """Take the write lock up front: one writer at a time, each transaction serializable,
    and no read-then-write upgrade that SQLite would refuse under concurrency."""
    connection.exec_driver_sql("BEGIN IMMEDIATE")


# One kept open for each request thread of an API process (AnyIO runs sync endpoints on
# 40 threads), so connections are not opened and closed per request: with 24, a run of
# 32 concurrent registrations opened 365 PostgreSQL sessions per 10,000 (bench/README.md).
POOL_SIZE = 40


def make_engine(url: str, *, pool_size: int = POOL_SIZE) -> Engine:
    """An engine for `url`; for SQLite the parent directory is created."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # UTC sessions hand back datetime.timezone.utc, which the UTCDateTime column passes
    # through untouched (it matters when a sweep reads a million timestamps).
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=8,
        pool_recycle=1800,  # not pre-ping: a round trip on every checkout is a registration's cost
        connect_args={"options": "-c timezone=UTC"},
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
    )


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Commit on success, roll back on error, close always (jobs and CLI use this)."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
