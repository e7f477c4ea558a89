"""Run a `ckpt` command with its Prometheus metrics served on a port of its own.

    python with_metrics.py PORT worker        # the same as `ckpt worker`, plus :PORT/metrics

`ckpt worker` and `ckpt scheduler` count what they do (bytes moved and purged, actions
finished, due-vs-executed lag, sweep durations, storage retries) in process-local counters,
but serve no HTTP: only an API process answers `/metrics`. This starts prometheus_client's
exporter inside the process, then hands over to the `ckpt` command line unchanged, so the
counters of every worker and scheduler replica can be scraped.

The port shows this process's counters only (labels are action kinds, tiers and providers;
no catalog data, no ids), which is why it needs no token, unlike the API's `/metrics`.
"""

from __future__ import annotations

import sys

from prometheus_client import start_http_server

from app.cli import main


def run(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: with_metrics.py PORT CKPT-COMMAND [ARGS...]")
    start_http_server(int(argv[0]))
    sys.argv = ["ckpt", *argv[1:]]
    main()


if __name__ == "__main__":
    run(sys.argv[1:])
