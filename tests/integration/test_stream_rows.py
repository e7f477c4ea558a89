"""A full plan reads its million checkpoints through stream_rows: batches read ahead by a
thread on PostgreSQL. What a caller relies on: every row once and in order, a connection
left usable when it stops early, and a failing row's error raised in its own thread;
whichever way PostgreSQL's rows arrive (in chunks of one result, or through a cursor)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import BigInteger, Column, Engine, MetaData, Table, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db import streaming
from app.db.streaming import stream_rows

ROWS = 40
SMALLEST = -9223372036854775808  # abs() of it overflows a 64-bit integer on both databases

numbers = Table("stream_numbers", MetaData(), Column("n", BigInteger), prefixes=["TEMPORARY"])


@pytest.fixture(params=["chunks", "cursor"])
def session(
    clean_engine: Engine, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Session]:
    """On PostgreSQL, read as one result in chunks (libpq 17 and later) and through a
    server-side cursor (an older libpq)."""
    if request.param == "cursor":
        monkeypatch.setattr(streaming, "CHUNKED", False)
    elif not streaming.CHUNKED:
        pytest.fail("this libpq reads no result in chunks: psycopg[binary] bundles one that does")
    with Session(clean_engine) as session:
        numbers.create(session.connection())
        yield session
        session.rollback()


def readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ckpt-stream-rows"]


def fill(session: Session, values: list[int]) -> None:
    session.execute(numbers.insert(), [{"n": n} for n in values])


def test_every_row_once_in_order_in_batches(session: Session) -> None:
    fill(session, list(range(ROWS)))
    batches = list(stream_rows(session, select(numbers.c.n).order_by(numbers.c.n), batch=7))
    assert [len(b) for b in batches] == [7, 7, 7, 7, 7, 5]
    assert [row[0] for b in batches for row in b] == list(range(ROWS))
    assert not readers()


def test_a_result_of_one_batch_or_less_comes_whole_from_the_callers_thread(
    session: Session,
) -> None:
    fill(session, list(range(ROWS)))
    stmt = select(numbers.c.n).order_by(numbers.c.n)
    for exact in (ROWS + 1, ROWS):  # shorter than a batch, and exactly one
        batches = []
        for rows in stream_rows(session, stmt, batch=exact):
            assert not readers()  # fetched in the caller's thread, no reader started yet
            batches.append([row[0] for row in rows])
        assert batches == [list(range(ROWS))]
    empty = select(numbers.c.n).where(numbers.c.n < 0)
    assert list(stream_rows(session, empty, batch=7)) == []


def test_stopping_early_leaves_the_connection_usable(session: Session) -> None:
    fill(session, list(range(ROWS)))
    stream = stream_rows(session, select(numbers.c.n).order_by(numbers.c.n), batch=5)
    first = next(stream)
    assert [row[0] for row in first] == [0, 1, 2, 3, 4]
    stream.close()  # the caller stops: the cursor is closed and the reader drained
    assert not readers()
    assert session.execute(select(func.count()).select_from(numbers)).scalar_one() == ROWS


def test_a_failing_row_raises_in_the_callers_thread(session: Session) -> None:
    # in the table's own order (no sort, which would compute every row first)
    fill(session, [SMALLEST if i == 30 else i for i in range(ROWS)])
    seen: list[int] = []
    stmt = select(func.abs(numbers.c.n))
    with pytest.raises((DBAPIError, psycopg.Error)):
        for batch in stream_rows(session, stmt, batch=4):
            seen.extend(row[0] for row in batch)
    assert seen[:28] == list(range(28))  # the batches before the failing row's arrived
    assert SMALLEST not in seen and len(seen) < ROWS
    assert not readers()


def test_stopping_early_in_a_large_result_cancels_it(session: Session) -> None:
    """Four million rows, two batches read: the rest is neither produced nor read (on
    PostgreSQL the query is cancelled), and the transaction goes on."""
    fill(session, list(range(2000)))
    other = numbers.alias("other")
    stmt = select(numbers.c.n, other.c.n).select_from(numbers.join(other, numbers.c.n >= 0))
    stream = stream_rows(session, stmt, batch=1000)
    assert [len(next(stream)), len(next(stream))] == [1000, 1000]
    stream.close()
    assert not readers()
    assert session.execute(select(func.count()).select_from(numbers)).scalar_one() == 2000
