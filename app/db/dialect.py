"""What differs between the two supported databases, and the only place that asks.

Services say what they want (an upsert, a lock, a skip-locked claim, a byte-order range);
this module says how SQLite and PostgreSQL each do it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg
from sqlalchemy import ColumnElement, Connection, Engine, Select, Table, any_, bindparam, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Base

_S = TypeVar("_S", bound=Select)  # type: ignore[type-arg]
_local_locks: dict[int, threading.Lock] = {}
_local_locks_guard = threading.Lock()


def on_postgresql(bind: Session | Connection | Engine) -> bool:
    """Whether `bind` talks to PostgreSQL (else SQLite, the embedded default)."""
    if isinstance(bind, Session):
        return bind.get_bind().dialect.name == "postgresql"
    return bind.dialect.name == "postgresql"


def insert_ignoring_conflicts(session: Session, model: type[Base]) -> Any:
    table = model.__table__
    assert isinstance(table, Table)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"unsupported database {dialect!r}")


def upsert(session: Session, model: type[Base], *, index: str, values: dict[str, Any]) -> Any:
    """INSERT ... ON CONFLICT (index) DO UPDATE the other columns: one statement, so two
    processes writing the same row at once cannot both insert it."""
    module = postgresql if on_postgresql(session) else sqlite
    stmt = module.insert(model.__table__).values(**values)
    changed = {k: stmt.excluded[k] for k in values if k != index}
    return stmt.on_conflict_do_update(index_elements=[index], set_=changed)


def skip_locked(session: Session, stmt: _S, *, of: Any) -> _S:
    """Rows another transaction has locked are passed over (so many workers claim
    different rows at once); SQLite has one writer at a time and needs nothing."""
    return stmt.with_for_update(skip_locked=True, of=of) if on_postgresql(session) else stmt


def byte_range(column: Any, session: Session, low: str, high: str) -> list[ColumnElement[bool]]:
    """`low <= column < high` compared byte by byte, in a form the uri index serves: on
    PostgreSQL the operators of `text_pattern_ops` (any collation); SQLite compares bytes."""
    if on_postgresql(session):
        return [column.op("~>=~")(low), column.op("~<~")(high)]
    return [column >= low, column < high]


def one_of(column: Any, session: Session, values: list[Any]) -> ColumnElement[bool]:
    """`column IN values` as PostgreSQL plans it best for long lists: one array parameter
    (`= ANY(...)`), so the statement's text is the same whatever the list's length and
    the driver parses it once; SQLite takes the IN list."""
    if on_postgresql(session):
        found: ColumnElement[bool] = column == any_(
            bindparam(None, values, type_=postgresql.ARRAY(column.type))
        )
        return found
    within: ColumnElement[bool] = column.in_(values)
    return within


@contextmanager
def transaction_lock(session: Session, key: int) -> Iterator[None]:
    """Serialise one kind of transaction: a PostgreSQL advisory lock held until the
    transaction ends (so several replicas never do it at once); a process lock on SQLite,
    whose single writer already keeps other processes out."""
    if on_postgresql(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        yield
        return
    with _local_locks_guard:
        lock = _local_locks.setdefault(key, threading.Lock())
    with lock:
        yield


@contextmanager
def try_session_lock(factory: sessionmaker[Session], key: int) -> Iterator[bool]:
    """Whether this process holds `key` for the duration of the block (a session advisory
    lock on a connection of its own, so the block may commit as it goes); always True on
    SQLite, where one process serves the database."""
    engine = factory.kw["bind"]
    if not on_postgresql(engine):
        yield True
        return
    params = {"key": key}
    with engine.connect() as connection:  # the lock lives as long as this connection
        got = bool(connection.execute(text("SELECT pg_try_advisory_lock(:key)"), params).scalar())
        connection.commit()
        try:
            yield got
        finally:
            if got:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), params)
                connection.commit()


@contextmanager
def savepoint(driver: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """A PostgreSQL savepoint on the driver's connection, inside the caller's transaction:
    released when the block ends, rolled back to when it raises (or a generator holding it
    is closed), the error going on to the caller. psycopg's own `transaction()` is no
    substitute here: on a connection with no statement run yet it begins and commits a
    transaction of its own, under SQLAlchemy's feet."""
    driver.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        with suppress(psycopg.Error):  # a broken connection: the caller's error says more
            driver.execute(f"ROLLBACK TO SAVEPOINT {name}")
        raise
    driver.execute(f"RELEASE SAVEPOINT {name}")


def fetch_all(session: Session, stmt: Select, *, many: bool = True) -> list[Any]:  # type: ignore[type-arg]
    """All rows of `stmt`. On PostgreSQL, when `many` may come back, straight from the
    driver: its tuples already hold UTC datetimes and parsed JSON, and a million rows skip
    SQLAlchemy's row processing. For a few rows SQLAlchemy's path is the cheaper one: it
    compiles a statement once, not on every call."""
    conn = session.connection()
    if not many or not on_postgresql(conn):
        return list(conn.execute(stmt).all())
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    # binary: timestamps and numbers arrive without being parsed from text
    with conn.connection.driver_connection.cursor(binary=True) as cursor:  # type: ignore[union-attr]
        cursor.execute(str(compiled), compiled.params)
        return cursor.fetchall()  # type: ignore[no-any-return]
