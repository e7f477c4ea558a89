"""Annotated dependency aliases. Transactions have two owners: the request (SessionDep:
routes and services flush, this dependency commits or rolls back) and the job (sweep,
reconcile, worker: they take a session factory and commit in phases). Nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Protocol

import anyio
from fastapi import BackgroundTasks, Depends, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import BaseRoute

from app.api.auth import authorize
from app.db.pagination import MAX_LIMIT
from app.domain.access import Principal
from app.domain.errors import Invalid
from app.domain.tier import Tier
from app.settings import Settings
from app.storage.registry import StorageRegistry


async def _session(request: Request) -> AsyncIterator[Session]:
    """Commit on success, roll back on error, close always. Creating a session does no I/O,
    so only a request that used the database pays a thread for its commit or rollback."""
    session: Session = request.app.state.session_factory()
    # The commit gets a thread of its own (a fresh limiter, as FastAPI does for the exits of
    # its dependencies): a transaction holding locks must never queue for a thread behind
    # requests that are waiting for those locks.
    ending = anyio.CapacityLimiter(1)
    try:
        yield session
        if session.in_transaction():
            await anyio.to_thread.run_sync(session.commit, limiter=ending)
    except BaseException:
        if session.in_transaction():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(session.rollback, limiter=ending)
        raise
    finally:
        session.close()  # no transaction is left open here, so this does no I/O


def query_parameters(routes: list[BaseRoute]) -> dict[int, tuple[str, ...]]:
    """id of each API route -> the query parameters it declares (its dependencies' too);
    routes of included routers are their own objects, as in app.api.auth.route_templates."""

    def walk(dependant: Dependant) -> list[str]:
        own = [p.alias for p in dependant.query_params]
        return own + [name for sub in dependant.dependencies for name in walk(sub)]

    return {
        id(context.original_route): tuple(dict.fromkeys(walk(context.original_route.dependant)))
        for context in iter_route_contexts(routes)
        if isinstance(context.original_route, APIRoute)
    }


async def known_query(request: Request) -> None:
    """Refuse a query parameter the route does not take: `?projct=gpt` silently ignored
    would list everything, which reads as an answer to the question asked."""
    if not request.query_params:
        return
    known: dict[int, tuple[str, ...]] = request.app.state.query_parameters
    route = request.scope.get("route")
    if id(route) not in known:  # a route added after the app was built
        known.update(query_parameters(request.app.routes))
    takes = known.get(id(route), ())
    for name in request.query_params:
        if name not in takes:
            hint = f"it takes {', '.join(takes)}" if takes else "it takes none"
            raise Invalid(f"{name} is not a query parameter of this route; {hint}", field=name)


async def _tiers(request: Request) -> list[Tier]:
    tiers: list[Tier] = request.app.state.tiers
    return tiers


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _session_factory(request: Request) -> sessionmaker[Session]:
    """For routes that start a job (a sweep, a reconciliation): the job owns its
    transactions, as it does when the scheduler runs it."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


class Background(Protocol):
    """What a route may ask of the process's background roles."""

    def request_evaluation(self, run_id: str) -> None: ...

    def run_import(self, import_id: str) -> None: ...

    def wake_workers(self) -> None: ...


async def _runtime(request: Request) -> Background:
    runtime: Background = request.app.state.runtime
    return runtime


async def _storages(request: Request) -> StorageRegistry:
    storages: StorageRegistry = request.app.state.storages
    return storages


async def _now() -> datetime:
    return datetime.now(UTC)


async def _evaluate_later(request: Request, tasks: BackgroundTasks) -> Callable[[str], None]:
    """Queue a run's policy evaluation for after the response (so after the commit)."""
    runtime: Background = request.app.state.runtime

    async def queue(run_id: str) -> None:  # on the event loop: no thread for a set insert
        runtime.request_evaluation(run_id)

    def later(run_id: str) -> None:
        tasks.add_task(queue, run_id)

    return later


# "function" scope: the transaction commits before the response leaves, so a client that
# got 201 can read the row back at once (the default would commit after sending it).
SessionDep = Annotated[Session, Depends(_session, scope="function")]
TiersDep = Annotated[list[Tier], Depends(_tiers)]
SettingsDep = Annotated[Settings, Depends(_settings)]
NowDep = Annotated[datetime, Depends(_now)]
# A job's own session factory: only routes that run a job take it (the request's session
# above is every other route's one transaction).
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(_session_factory)]
RuntimeDep = Annotated[Background, Depends(_runtime)]
# The process's storage adapters, one per tier (their clients' connection pools shared).
StoragesDep = Annotated[StorageRegistry, Depends(_storages)]
# The caller, checked already by the app-wide `authorize` (FastAPI runs it once a request).
PrincipalDep = Annotated[Principal, Depends(authorize)]
EvaluateLater = Annotated[Callable[[str], None], Depends(_evaluate_later)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="page size, at most 1000")]
# An id to filter by: no id holds a NUL, and PostgreSQL refuses one as a parameter.
IdFilter = Annotated[str | None, Query(max_length=40, pattern=r"^[^\x00]*$")]
Cursor = Annotated[str | None, Query(max_length=512, description="next_cursor of the last page")]
