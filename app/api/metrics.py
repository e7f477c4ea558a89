"""`GET /metrics`: Prometheus text format.

Two sources in one answer:
- this process's own counters and histograms (app/metrics.py), with prometheus_client's
  process and Python collectors: per process, so a separate `ckpt worker` or `ckpt
  scheduler` keeps its own and this endpoint shows only what this API process did;
- at each scrape, read from the database that every replica shares, so the same from
  any replica: the ledger's actions by kind and state, each tier's bytes and
  checkpoints (what GET /v1/tiers reports, every project included), and per shadow policy
  how its shadow ledger differs from reality (app.services.cost.shadow_queries: grouped
  statements, none when no policy is in shadow mode).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from app.api.deps import SessionFactoryDep, TiersDep
from app.db.session import session_scope
from app.domain.states import ActionKind, ActionState
from app.domain.tier import Tier
from app.services.catalog.checkpoints import count_drifting
from app.services.catalog.tier_usage import tier_usage
from app.services.cost.shadow_queries import ShadowFigures, shadow_figures
from app.services.lifecycle import ledger

router = APIRouter(tags=["metrics"])

ACTION_KINDS = tuple(ActionKind)
ACTION_STATES = tuple(ActionState)


class CatalogCollector:
    """The ledger and the tiers' usage, queried when scraped (two grouped queries)."""

    def __init__(self, factory: sessionmaker[Session], tiers: list[Tier]) -> None:
        self.factory = factory
        self.tiers = tiers

    def collect(self) -> Iterator[Metric]:
        with session_scope(self.factory) as session:
            counts = ledger.count_by_kind_and_state(session)
            usage = tier_usage(session)
            drifting = count_drifting(session)
            shadows = shadow_figures(session, self.tiers)
        actions = GaugeMetricFamily(
            "ckpt_actions",
            "Actions in the ledger by kind and state, now.",
            labels=["kind", "state"],
        )
        # Every known combination, zeros included, so a series never vanishes when it empties.
        for key in {(k, s) for k in ACTION_KINDS for s in ACTION_STATES} | set(counts):
            actions.add_metric(list(key), counts.get(key, 0))
        yield actions
        size = GaugeMetricFamily(
            "ckpt_tier_bytes",
            "Bytes of the active and trashed checkpoints with a location on each tier.",
            labels=["tier"],
        )
        checkpoints = GaugeMetricFamily(
            "ckpt_tier_checkpoints",
            "Active and trashed checkpoints with a location on each tier.",
            labels=["tier"],
        )
        for name in [t.name for t in self.tiers] + sorted(
            set(usage) - {t.name for t in self.tiers}
        ):
            held_bytes, held = usage.get(name, (0, 0))
            size.add_metric([name], held_bytes)
            checkpoints.add_metric([name], held)
        yield size
        yield checkpoints
        yield GaugeMetricFamily(
            "ckpt_checkpoints_drifting",
            "Checkpoints whose files the last reconciliation found missing or changed.",
            value=drifting,
        )
        yield from _shadow_metrics(shadows)


SHADOW_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "bytes_freed",
        "ckpt_shadow_bytes_freed",
        "Bytes a shadow policy would have deleted that are still stored (active or trashed).",
    ),
    (
        "usd_month",
        "ckpt_shadow_usd_month",
        "USD a month those bytes cost at their tiers' prices, plus what the shadow policy's "
        "moves not made in reality would save.",
    ),
    (
        "only_shadow",
        "ckpt_shadow_only_shadow",
        "Would-be actions of a shadow policy with no real action of the same checkpoint, kind "
        "and target tier.",
    ),
    (
        "only_enforced",
        "ckpt_shadow_only_enforced",
        "Rule-planned real actions with no would-be counterpart, on the runs the shadow policy "
        "recorded would-be actions for.",
    ),
    (
        "regrets",
        "ckpt_shadow_regrets",
        "Checkpoints a shadow policy would have deleted or moved that were restored, resumed "
        "from or pinned after.",
    ),
)


def _shadow_metrics(shadows: dict[str, ShadowFigures]) -> Iterator[Metric]:
    for field, name, documentation in SHADOW_GAUGES:
        gauge = GaugeMetricFamily(name, documentation, labels=["policy"])
        for policy, figures in sorted(shadows.items()):
            gauge.add_metric([policy], float(getattr(figures, field)))
        yield gauge


class _Scrape:
    """One scrape: the process's registry, then the catalog."""

    def __init__(self, *collectors: Collector) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request, factory: SessionFactoryDep, tiers: TiersDep) -> Response:
    """Prometheus metrics: this process's counters, the ledger and the tiers' usage. The
    Prometheus text format, or OpenMetrics when the scraper's Accept header asks for it."""
    catalog = CatalogCollector(factory, tiers)
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(content=encode(_Scrape(REGISTRY, catalog)), media_type=content_type)
