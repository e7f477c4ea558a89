"""Reading a million rows while they are still being produced.

A full plan reads every active checkpoint, and read whole (`dialect.fetch_all`) the
process waits for PostgreSQL to produce them all, then builds its snapshots while
PostgreSQL waits for it: about a second each at a million rows. Read by a thread one
batch ahead, the database produces the next batch on its own core while this process
turns the last one into snapshots.

The rows come as one query's result in chunks (libpq 17's chunked rows mode), PostgreSQL
sending them as fast as it produces them. Through a server-side cursor, as before, the
database produced each batch only when asked for it, and sat idle while the driver
parsed the one before: half a plan's range of 500,000 checkpoints (a hash join with
every location) took 1.8-1.9 s to read that way, 1.4 s in chunks, for the same CPU here.
A plan of a million in one process: 6.4-6.8 s against 6.8-7.4 s. (Split across two
processes on two cores, the CPU is the bound either way.) With an older libpq the
cursor remains.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import Select
from sqlalchemy.orm import Session

from app.db.dialect import on_postgresql, savepoint

BATCH = 50_000  # rows per fetch: a few MB of tuples, and a round trip per 50,000 rows
CHUNKED = psycopg.capabilities.has_stream_chunked()  # libpq 17 or later


def stream_rows(
    session: Session,
    stmt: Select,  # type: ignore[type-arg]
    *,
    batch: int = BATCH,
) -> Generator[Sequence[Any], None, None]:
    """The rows of `stmt`, a batch at a time, in the session's transaction. On PostgreSQL
    the rows come as the driver's tuples (UTC datetimes, parsed JSON), as fetch_all's do;
    on SQLite, SQLAlchemy's rows. Stop iterating early and the cursor is closed."""
    conn = session.connection()
    if not on_postgresql(conn):
        result = conn.execute(stmt)
        while rows := result.fetchmany(batch):
            yield rows
        return
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    driver = conn.connection.driver_connection
    assert driver is not None
    sql, params = str(compiled), compiled.params
    if CHUNKED:
        # A generator holding the connection until its last row, or until it is closed:
        # then psycopg cancels the query, which aborts what it ran in. Under a savepoint,
        # the caller's transaction goes on, as it does after a cursor is closed.
        with savepoint(driver, "ckpt_stream"), driver.cursor(binary=True) as cursor:
            rows = cursor.stream(sql, params, size=batch)
            with contextlib.closing(rows):
                yield from _batches(lambda: list(itertools.islice(rows, batch)), batch)
        return
    # A cursor is planned for its first rows by default (a tenth of them); these are all
    # read, so they are planned as a plain query is, and get its hash joins.
    driver.execute("SET LOCAL cursor_tuple_fraction = 1.0")
    name = f"ckpt_stream_{uuid.uuid4().hex[:12]}"
    with driver.cursor(name=name, binary=True) as cursor:
        cursor.execute(sql, params)
        yield from _batches(lambda: cursor.fetchmany(batch), batch)


def _batches(take: Callable[[], Sequence[Any]], batch: int) -> Iterator[Sequence[Any]]:
    """The first batch in this thread: a short one is the whole result (a small catalog,
    a periodic sweep's few runs), with no thread started and no fetch more; the rest read
    ahead."""
    first = take()
    if first:
        yield first
    if len(first) == batch:
        yield from _read_ahead(take, batch)


def _read_ahead(take: Callable[[], Sequence[Any]], batch: int) -> Iterator[Sequence[Any]]:
    """The batches `take` reads, each by a thread while the caller works on the one before
    (waiting on the socket lets the GIL go). The thread alone uses the connection until
    the last batch, or until the caller stops and the thread is drained."""
    handoff: queue.Queue[Sequence[Any] | BaseException] = queue.Queue(maxsize=1)
    stopped = threading.Event()

    def pump() -> None:
        try:
            while not stopped.is_set():
                rows = take()
                handoff.put(rows)
                if len(rows) < batch:  # the last, short or empty
                    return
        except BaseException as error:  # handed to the caller, raised in its thread
            handoff.put(error)

    reader = threading.Thread(target=pump, name="ckpt-stream-rows", daemon=True)
    reader.start()
    try:
        while True:
            item = handoff.get()
            if isinstance(item, BaseException):
                raise item
            if item:
                yield item
            if len(item) < batch:
                return
    finally:
        stopped.set()
        while reader.is_alive():  # a pump blocked on a full hand-off gets its room
            with contextlib.suppress(queue.Empty):
                handoff.get(timeout=0.05)
        reader.join()
