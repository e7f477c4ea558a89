"""Tiers with their usage, and liveness."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from app.api.cost_schemas import TierPricedRead, price_read
from app.api.deps import Cursor, Limit, PrincipalDep, SessionDep, TiersDep
from app.api.schemas import Health, ObjectLockRead, Page, ProviderSettingsRead, TierUsage
from app.cost.prices import effective_price
from app.db.pagination import decode_cursor, encode_cursor
from app.domain.duration import format_duration
from app.domain.provider import ProviderSettings
from app.services.catalog.tier_usage import tier_usage

router = APIRouter(tags=["tiers"])


@router.get("/v1/tiers")
def list_tiers(
    session: SessionDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[TierPricedRead]:
    """Hottest first, with what each holds now (active and trashed checkpoints); for a token
    bounded to some projects, what those projects hold. `price` is the tier's effective
    price: the built-in catalog's figures for its provider and storage class, each figure
    its tiers-file `price` sets winning (a local tier costs 0 unless priced)."""
    start = decode_cursor(cursor, int)[0] + 1 if cursor is not None else 0
    page = tiers[start : start + limit]
    usage = tier_usage(session, projects=principal.projects)
    items = [
        TierPricedRead(
            name=tier.name,
            url=tier.url,
            rank=tier.rank,
            storage_class=tier.storage_class,
            endpoint_url=tier.endpoint_url,
            price=price_read(effective_price(tier)),
            usage=TierUsage(
                bytes=usage.get(tier.name, (0, 0))[0], checkpoints=usage.get(tier.name, (0, 0))[1]
            ),
            provider=provider_read(tier.provider),
        )
        for tier in page
    ]
    more = start + limit < len(tiers)
    return Page[TierPricedRead](
        items=items, next_cursor=encode_cursor(page[-1].rank) if more else None
    )


def provider_read(settings: ProviderSettings) -> ProviderSettingsRead:
    def shown(value: timedelta | None) -> str | None:
        return None if value is None else format_duration(value)

    lock = settings.object_lock
    return ProviderSettingsRead(
        soft_delete=shown(settings.soft_delete),
        versioned=settings.versioned,
        keep_versions=settings.keep_versions,
        noncurrent_expiry=shown(settings.noncurrent_expiry),
        object_lock=ObjectLockRead(mode=lock.mode, retain=format_duration(lock.retain))
        if lock
        else None,
        autoclass=settings.autoclass,
        billed_after_delete=shown(settings.billed_after_delete),
        source=settings.source,
    )


@router.get("/healthz", tags=["health"])
async def healthz() -> Health:
    return Health(status="ok")
