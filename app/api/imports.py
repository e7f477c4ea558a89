"""`/v1/imports`: adopting a tree of checkpoints no catalog knows (DESIGN section 14).

`POST` checks the request, records it and answers 202 at once; the import runs in this
process's background (a thread of the runtime) and its progress is read back with
`GET /v1/imports/{id}`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, BackgroundTasks, Request, status
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import Cursor, Limit, NowDep, PrincipalDep, SessionDep, StoragesDep, TiersDep
from app.api.schemas import Name, Strict
from app.db.models import ImportItem, ImportRow
from app.domain.layouts import UNRECOGNIZED_SAMPLE
from app.services.catalog import imports as service

router = APIRouter(tags=["imports"])

Layout = Literal["auto", "hf", "lightning", "dcp", "orbax", "megatron", "deepspeed", "generic"]


class ImportCreate(Strict):
    uri: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2048,
            pattern=r"^[^\x00]*$",
            description="the tree to adopt: under a configured tier (its root included)",
        ),
    ]
    project: Name
    layout: Layout = Field("auto", description="`auto` recognises each directory by its name")
    run: Name | None = Field(None, description="every checkpoint goes to this run")
    class_: Name = Field("milestone", alias="class")
    dry_run: bool = Field(False, description="register nothing; list what would be")
    active: bool = Field(False, description="runs created stay `active` (not `completed`)")


class Reported(BaseModel):
    key: str = Field(description="relative to the import's uri")
    reason: str


class ImportItemRead(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    run: str
    step: int
    class_: str = Field(alias="class", serialization_alias="class")
    uri: str
    size_bytes: int
    created_at: datetime
    layout: str
    checkpoint_id: str | None = Field(description="null for a dry run")


class ImportRead(BaseModel):
    id: str
    uri: str
    tier: str
    project: str
    layout: str
    run: str | None
    class_: str = Field(alias="class", serialization_alias="class")
    dry_run: bool
    active: bool
    state: Literal["running", "done", "failed"]
    listed: int = Field(description="objects listed so far")
    discovered: int = Field(description="checkpoints found (complete ones)")
    registered: int = Field(description="checkpoints registered (dry: that would be)")
    registered_bytes: int
    existing: int = Field(description="found checkpoints the catalog already holds")
    runs: int = Field(description="runs that received (dry: would receive) checkpoints")
    incomplete: list[Reported] = Field(
        description=f"checkpoints never registered, and why (the first {service.REPORTED})"
    )
    incomplete_count: int
    skipped: list[Reported] = Field(
        description="complete checkpoints not registered: their uri overlaps a catalogued "
        f"location, or their run holds the step elsewhere (the first {service.REPORTED})"
    )
    skipped_count: int
    unrecognized: int = Field(description="objects that belong to no checkpoint")
    unrecognized_keys: list[str] = Field(
        description=f"the first {UNRECOGNIZED_SAMPLE} of them, relative to the uri"
    )
    error: str | None = Field(description="why a `failed` import stopped")
    sweep_id: str | None = Field(description="the evaluation of the project once it was in")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    created_by: str
    model_config = ConfigDict(populate_by_name=True)


class ImportDetail(ImportRead):
    items: list[ImportItemRead] = Field(
        description="what was (dry: would be) registered, in listing order; paginated"
    )
    next_cursor: str | None


class ImportPage(BaseModel):
    items: list[ImportRead]
    next_cursor: str | None


def _read(row: ImportRow) -> ImportRead:
    return ImportRead(
        id=row.id,
        uri=row.uri,
        tier=row.tier,
        project=row.project,
        layout=row.layout,
        run=row.run,
        class_=row.klass,
        dry_run=row.dry_run,
        active=row.active,
        state=row.state,
        listed=row.listed,
        discovered=row.discovered,
        registered=row.registered,
        registered_bytes=row.bytes_registered,
        existing=row.existing,
        runs=row.runs,
        incomplete=[Reported(**entry) for entry in row.incomplete],
        incomplete_count=row.incomplete_count,
        skipped=[Reported(**entry) for entry in row.skipped],
        skipped_count=row.skipped_count,
        unrecognized=row.unrecognized,
        unrecognized_keys=list(row.unrecognized_sample),
        error=row.error,
        sweep_id=row.sweep_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        created_by=row.created_by,
    )


def _item(row: ImportItem) -> ImportItemRead:
    return ImportItemRead(
        run=row.run,
        step=row.step,
        class_=row.klass,
        uri=row.uri,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
        layout=row.layout,
        checkpoint_id=row.checkpoint_id,
    )


def _detail(session: SessionDep, row: ImportRow, limit: int, cursor: str | None) -> ImportDetail:
    items, next_cursor = service.list_items(session, row.id, limit=limit, cursor=cursor)
    return ImportDetail(
        **_read(row).model_dump(), items=[_item(i) for i in items], next_cursor=next_cursor
    )


@router.post("/v1/imports", status_code=status.HTTP_202_ACCEPTED)
def create_import(
    body: ImportCreate,
    request: Request,
    session: SessionDep,
    tiers: TiersDep,
    storages: StoragesDep,
    principal: PrincipalDep,
    now: NowDep,
    tasks: BackgroundTasks,
) -> ImportDetail:
    runtime = request.app.state.runtime
    row = service.create_import(
        session,
        service.ImportRequest(
            uri=body.uri,
            project=body.project,
            layout=body.layout,
            run=body.run,
            klass=body.class_,
            dry_run=body.dry_run,
            active=body.active,
        ),
        tiers=tiers,
        storages=storages,
        actor=principal.actor,
        owner=runtime.imports.owner,
        lease=runtime.imports.lease,
        now=now,
    )
    tasks.add_task(runtime.run_import, row.id)  # after the response, so after the commit
    return ImportDetail(**_read(row).model_dump(), items=[], next_cursor=None)


@router.get("/v1/imports")
def list_imports(session: SessionDep, limit: Limit = 100, cursor: Cursor = None) -> ImportPage:
    rows, next_cursor = service.list_imports(session, limit=limit, cursor=cursor)
    return ImportPage(items=[_read(row) for row in rows], next_cursor=next_cursor)


@router.get("/v1/imports/{import_id}")
def get_import(
    import_id: str, session: SessionDep, limit: Limit = 100, cursor: Cursor = None
) -> ImportDetail:
    return _detail(session, service.get_import(session, import_id), limit, cursor)
