"""The FastAPI application: routers, error handlers and the resources they share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

from app.api import checkpoints, errors, runs, tiers
from app.db.session import make_engine, make_session_factory
from app.settings import Settings, get_settings
from app.tiers import load_tiers


def create_app(settings: Settings | None = None, *, engine: Engine | None = None) -> FastAPI:
    """Build the app. Tiers are loaded (and local tier directories made) here, so a bad
    tiers file fails at start, not on the first request."""
    settings = settings or get_settings()
    owns_engine = engine is None
    engine = engine or make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_engine:
            engine.dispose()

    app = FastAPI(
        title="Checkpoint lifecycle service",
        version="1",
        description="Catalogs ML training checkpoints and enforces their retention.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tiers = load_tiers(settings)
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    errors.install(app)
    for module in (runs, checkpoints, tiers):
        app.include_router(module.router)
    return app
