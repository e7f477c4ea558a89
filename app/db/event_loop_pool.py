"""Connections for the event loop: a small psycopg pool of autocommit connections that
registration's fast path (app.api.fast_registration) uses without a worker thread.

The rest of the service runs its queries through SQLAlchemy in worker threads. The one
call every training job makes at every save was bound by the API process's CPU, and a
third of that went to handing each request to a thread and back and to forty threads
taking turns at the interpreter lock around their queries (bench/README.md). On the event
loop a registration costs none of that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine

from app.db.dialect import on_postgresql

# Per API process. A registration holds a connection for its two statements only, so a
# few serve dozens of clients; kept small, two workers and the SQLAlchemy pools stay well
# inside PostgreSQL's default of 100 connections.
EVENT_LOOP_POOL_SIZE = 16

# The registration's statement (psycopg prepares it on its fifth use) is planned once per
# connection, not at every call. Left to choose, PostgreSQL kept planning it for each set
# of values, since those plans look cheaper on paper; planning was 0.35 of its 0.8 ms of
# PostgreSQL CPU (bench/README.md). The plan is made again when ANALYZE changes the
# tables' statistics, as autovacuum does while a catalog grows.
_PLANS = "force_generic_plan"


def libpq_conninfo(engine: Engine) -> str:
    """The engine's database, as libpq takes it (password included, never logged)."""
    url = engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


@dataclass(frozen=True, slots=True)
class EventLoopPool:
    """The pool and the loop it was opened on: its connections answer on that loop only
    (an app driven from another loop, as some tests drive it, goes through threads)."""

    pool: AsyncConnectionPool[Any]
    loop: asyncio.AbstractEventLoop

    def here(self) -> AsyncConnectionPool[Any] | None:
        """The pool, if the running loop is its own."""
        return self.pool if asyncio.get_running_loop() is self.loop else None


async def open_event_loop_pool(engine: Engine) -> EventLoopPool | None:
    """A pool on the running loop for a PostgreSQL engine; None for SQLite, whose writes
    take the file's lock and stay in worker threads. Connections open in the background:
    a database not up yet delays no start."""
    if not on_postgresql(engine):
        return None
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        libpq_conninfo(engine),
        min_size=0,  # none until a registration asks: most app instances of a test never do
        max_size=EVENT_LOOP_POOL_SIZE,
        kwargs={"autocommit": True, "options": f"-c timezone=UTC -c plan_cache_mode={_PLANS}"},
        timeout=10.0,
        max_lifetime=1800.0,
        open=False,
        name="registration",
    )
    await pool.open(wait=False)
    return EventLoopPool(pool, asyncio.get_running_loop())
