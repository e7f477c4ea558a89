"""`GET /v1/reconcile` (scan now) and `POST /v1/reconcile/orphans/delete` (an admin's ask)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from starlette.concurrency import run_in_threadpool

from app.api.deps import NowDep, PrincipalDep, SessionFactoryDep, StoragesDep, TiersDep
from app.domain.errors import Invalid
from app.services.lifecycle import reconcile as service

router = APIRouter(tags=["reconcile"])


class OrphanRead(BaseModel):
    tier: str
    key: str = Field(description="relative to the tier's url")
    uri: str
    size_bytes: int
    modified: datetime | None


class DriftRead(BaseModel):
    checkpoint_id: str
    tier: str
    key: str = Field(description="relative to the tier's url")
    uri: str
    problem: str = Field(
        description="`missing`, `overlap` (the location equals, contains or lies inside "
        "another live checkpoint's: see `other_checkpoint_id`), or what differs: size, "
        "sha256, crc32c or crc64nvme"
    )
    other_checkpoint_id: str | None = Field(
        default=None, description="`overlap`: the checkpoint whose location it overlaps"
    )
    other_uri: str | None = Field(default=None, description="`overlap`: that location")


class ReconcileRead(BaseModel):
    orphans: list[OrphanRead]
    drift: list[DriftRead]
    scanned_objects: int
    unreachable: dict[str, str] = Field(description="tiers that could not be listed, and why")


class OrphanRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tier: str = Field(max_length=63)
    key: str = Field(min_length=1, max_length=1024)


class OrphanDeleteRequest(BaseModel):
    # Either a list of orphans or `all: true`, as the document says too.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["orphans"],
                    "properties": {"all": {"type": "boolean", "const": False}},
                },
                {
                    "required": ["all"],
                    "properties": {"all": {"type": "boolean", "const": True}},
                    "not": {"required": ["orphans"]},
                },
            ]
        },
    )

    orphans: list[OrphanRef] | SkipJsonSchema[None] = Field(
        default=None,
        max_length=10_000,
        description="the orphans to delete, as a scan reported them; `all: true` instead "
        "deletes every orphan the fresh scan finds",
    )
    all: bool = False


class RefusedRead(BaseModel):
    tier: str
    key: str
    reason: str


class OrphanDeleteRead(BaseModel):
    deleted: list[OrphanRead]
    refused: list[RefusedRead]


@router.get("/v1/reconcile")
async def reconcile(
    factory: SessionFactoryDep,
    storages: StoragesDep,
    tiers: TiersDep,
    principal: PrincipalDep,
    deep: Annotated[
        bool,
        Query(description="also read the bytes of files whose tier reports no checksum"),
    ] = False,
) -> ReconcileRead:
    """Compare every tier with the catalog now: objects no checkpoint owns (orphans) and
    catalogued files missing or changed (drift; the checkpoint's `health` becomes `drift`).
    Deletes nothing."""
    report = await run_in_threadpool(
        service.reconcile, factory, tiers, storages=storages, deep=deep, actor=principal.actor
    )
    return ReconcileRead(
        orphans=[OrphanRead(**asdict(o)) for o in report.orphans],
        drift=[DriftRead(**asdict(d)) for d in report.drift],
        scanned_objects=report.scanned_objects,
        unreachable=report.unreachable,
    )


@router.post("/v1/reconcile/orphans/delete")
async def delete_orphans(
    body: OrphanDeleteRequest,
    factory: SessionFactoryDep,
    storages: StoragesDep,
    tiers: TiersDep,
    now: NowDep,
) -> OrphanDeleteRead:
    """Delete orphans, only when an admin asks: those named (or, with `all`, every one) that
    a fresh scan still finds orphaned and that were written over an hour ago."""
    if (body.orphans is None) == (not body.all) or (
        "orphans" in body.model_fields_set and body.orphans is None
    ):
        raise Invalid("name the orphans, or set all: true (not both)", field="orphans")
    names = {t.name for t in tiers}
    for i, orphan in enumerate(body.orphans or []):
        if orphan.tier not in names:
            raise Invalid(f"unknown tier {orphan.tier!r}", field=f"orphans[{i}].tier")
    wanted = None if body.all else [(o.tier, o.key) for o in body.orphans or []]
    deleted, refused = await run_in_threadpool(
        service.delete_orphans, factory, tiers, wanted, storages=storages, now=now
    )
    return OrphanDeleteRead(
        deleted=[OrphanRead(**asdict(o)) for o in deleted],
        refused=[RefusedRead(tier=t, key=k, reason=r) for t, k, r in refused],
    )
