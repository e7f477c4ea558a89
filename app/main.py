"""The FastAPI application: routers, error handlers and the resources they share."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine

from app import console
from app.api import (
    audit,
    backtest,
    checkpoints,
    cost,
    errors,
    imports,
    lifecycle,
    metrics,
    policies,
    reconcile,
    runs,
    tiers,
    tokens,
)
from app.api.auth import authorize, document_security, route_templates
from app.api.deps import known_query, query_parameters
from app.api.fast_registration import FastRegistration
from app.api.openapi import document_inputs, document_policies, document_problems
from app.api.schemas import CheckpointCreate
from app.bootstrap import bootstrap_token, load_policies_into
from app.db.event_loop_pool import open_event_loop_pool
from app.db.session import make_engine, make_session_factory
from app.scheduler.runtime import Runtime
from app.services.lifecycle import plan_helpers
from app.settings import Settings, get_settings
from app.storage.bucket_settings import detect_all
from app.storage.mounts import all_on_local_disks
from app.storage.registry import StorageRegistry
from app.tiers_config import load_tiers

log = logging.getLogger("app.main")


@dataclass(frozen=True)
class Roles:
    """What background work runs beside the API in this process."""

    worker: bool = True
    scheduler: bool = True
    evaluator: bool = True


SERVE = Roles()
API_ONLY = Roles(worker=False, scheduler=False, evaluator=False)  # `ckpt scheduler` evaluates
NO_BACKGROUND = Roles(worker=False, scheduler=False, evaluator=False)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    roles: Roles = SERVE,
    storages: StorageRegistry | None = None,
) -> FastAPI:
    """Build the app. Tiers and policy files are validated here, so a bad file fails at
    start, not on the first request."""
    settings = settings or get_settings()
    owns_engine = engine is None
    engine = engine or make_engine(settings.database_url)
    storages = storages or StorageRegistry()  # the tiers' adapters, shared by every request
    tier_list = detect_all(load_tiers(settings), storages.storage_for)
    factory = make_session_factory(engine)
    runtime = Runtime(
        factory,
        tier_list,
        sweep_interval=settings.sweep_interval,
        trash_retention=settings.trash_retention,
        reconcile_interval=settings.reconcile_interval,
        worker=roles.worker,
        scheduler=roles.scheduler,
        evaluator=roles.evaluator,
        storages=storages,
        import_lease=settings.import_lease,
        reservation_ttl=settings.reservation_ttl,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        load_policies_into(factory, settings, tier_list)
        bootstrap_token(factory, settings)
        plan_helpers.configure(settings.plan_processes)
        with factory() as session:  # a large catalog's first plan finds them started
            plan_helpers.warm(session, wait=plan_helpers.WARM_WAIT_S)
        runtime.start()
        app.state.event_loop_pool = await open_event_loop_pool(engine)
        # Everything built so far lives as long as the process: keep it out of the cyclic
        # collector's full passes, which otherwise stall requests for tens of milliseconds.
        gc.collect()
        gc.freeze()
        # A request allocates a few thousand short-lived objects: collect young ones less often.
        gc.set_threshold(20_000, 20, 20)
        yield
        if app.state.event_loop_pool is not None:
            await app.state.event_loop_pool.pool.close()
            app.state.event_loop_pool = None
        runtime.stop()
        plan_helpers.shutdown()
        storages.close()
        if owns_engine:
            engine.dispose()

    app = FastAPI(
        title="Checkpoint lifecycle service",
        version="1",
        description="Catalogs ML training checkpoints and enforces their retention.",
        lifespan=lifespan,
        # every route: through the rule table, then no query parameter it does not take
        dependencies=[Depends(authorize), Depends(known_query)],
    )
    app.state.settings = settings
    app.state.tiers = tier_list
    app.state.engine = engine
    app.state.session_factory = factory
    app.state.runtime = runtime
    app.state.storages = storages
    app.state.event_loop_pool = None  # opened with the app's loop, for PostgreSQL
    app.state.files_on_loop = all_on_local_disks([t.parsed.path for t in tier_list if t.is_local])
    errors.install(app)
    app.add_middleware(FastRegistration, state=app.state)
    routers = (
        runs,
        checkpoints,
        lifecycle,
        policies,
        tiers,
        tokens,
        cost,
        backtest,
        metrics,
        reconcile,
        imports,
    )
    for module in (*routers, audit, console):
        app.include_router(module.router)
    app.state.route_templates = route_templates(app.routes)
    app.state.query_parameters = query_parameters(app.routes)
    _document_raw_bodies(app)
    return app


def _document_raw_bodies(app: FastAPI) -> None:
    """Bodies the app parses itself (registration, for speed) still belong in /docs."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            body = CheckpointCreate.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            for name, sub in body.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components["CheckpointCreate"] = body
            document_security(schema)
            document_problems(schema)
            document_inputs(schema, app.state.tiers)
            document_policies(schema, app.state.tiers)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_api_app() -> FastAPI:
    """Factory for `ckpt api`: the API only. The evaluations its registrations ask for are
    recorded in the database and made by `ckpt scheduler` (or `ckpt serve`)."""
    return create_app(roles=API_ONLY)
