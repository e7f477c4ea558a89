"""`ckpt worker` and `ckpt scheduler`: background roles of the service. Like `serve`, `api`
and `migrate` (serve.py) they are the service, so they open the database; every other
command asks the service over HTTP (remote.py). Their heavy imports (the scheduler, the
database, Prometheus) happen when they run, so that those other commands start quickly."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.output import progress
from app.logging import configure_logging

if TYPE_CHECKING:
    from app.cli.common import Catalog
    from app.scheduler.runtime import Runtime
    from app.settings import Settings

DRAIN_LIMIT = 10_000  # as Worker.drain: one `--once` run ends even if actions keep coming


def _serve_metrics(settings: Settings) -> None:
    """A worker's or scheduler's own counters (bytes moved and purged, actions finished, lag,
    retries, sweep durations) on CKPT_METRICS_PORT, for Prometheus to scrape each replica.
    They hold no catalog data, so this port asks for no token: keep it inside the cluster."""
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr=settings.host)


def _runtime(ctx: Catalog, *, worker: bool, scheduler: bool, evaluator: bool) -> Runtime:
    from app.scheduler.runtime import Runtime
    from app.services.lifecycle import plan_helpers

    configure_logging()
    if scheduler or evaluator:  # the roles that plan
        plan_helpers.configure(ctx.settings.plan_processes)
        with ctx.factory() as session:  # a large catalog's first replan finds them started
            plan_helpers.warm(session, wait=plan_helpers.WARM_WAIT_S)
    return Runtime(
        ctx.factory,
        ctx.tiers,
        sweep_interval=ctx.settings.sweep_interval,
        trash_retention=ctx.settings.trash_retention,
        reconcile_interval=ctx.settings.reconcile_interval,
        worker=worker,
        scheduler=scheduler,
        evaluator=evaluator,
        storages=ctx.storages,
        import_lease=ctx.settings.import_lease,
        reservation_ttl=ctx.settings.reservation_ttl,
    )


def _run_until_signal(runtime: Runtime) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    runtime.start()
    stop.wait()
    runtime.stop()


def _checked_settings() -> Settings:
    from app.cli.common import checked_settings

    return checked_settings()


def register(cli: typer.Typer, load: Callable[[], Settings] = _checked_settings) -> None:
    """Add the background roles to `cli`; `load` validates settings or exits."""

    @cli.command()
    def worker(
        once: Annotated[bool, typer.Option(help="execute what is due, then exit")] = False,
    ) -> None:
        """Execute ledger actions (run as many as you like). Opens the database."""
        from app.cli.common import open_catalog

        ctx = open_catalog(load())
        runtime = _runtime(ctx, worker=True, scheduler=False, evaluator=False)
        if once:
            executed = 0
            with progress("executing due actions") as tick:
                while executed < DRAIN_LIMIT and runtime.executor.run_once():
                    executed += 1
                    tick.advance()
            typer.echo(f"{executed} actions executed")
            return
        _serve_metrics(ctx.settings)
        _run_until_signal(runtime)

    @cli.command()
    def scheduler() -> None:
        """Periodic sweep and purge, and the evaluations registrations ask for (several
        replicas are safe: evaluations take a lock). Opens the database."""
        from app.cli.common import open_catalog

        ctx = open_catalog(load())
        runtime = _runtime(ctx, worker=False, scheduler=True, evaluator=True)
        _serve_metrics(ctx.settings)
        _run_until_signal(runtime)
