"""Imports as records: asking for one, reading them back, and the progress each batch
writes (DESIGN section 14). Running one is app.services.lifecycle.importer's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, ImportItem, ImportRow, Location
from app.db.pagination import decode_cursor, encode_cursor
from app.domain.errors import Conflict, Invalid, NotFound, Unavailable
from app.domain.ids import new_id
from app.domain.layouts import AUTO, LAYOUTS, UNRECOGNIZED_SAMPLE
from app.domain.states import LIVE_STATES
from app.domain.tier import Located, Tier, locate, parse_url
from app.services.catalog.adoption import Outcome
from app.services.catalog.overlap import Overlap, ancestors
from app.storage.base import StorageError
from app.storage.registry import StorageRegistry

RUNNING, DONE, FAILED = "running", "done", "failed"
REPORTED = 1000  # incomplete and skipped checkpoints listed on the import, each (all counted)


@dataclass(frozen=True, slots=True)
class ImportRequest:
    uri: str
    project: str
    layout: str = AUTO
    run: str | None = None
    klass: str = "milestone"
    dry_run: bool = False
    active: bool = False


class LostLease(Exception):
    """Another process took the import over (this one was presumed dead): stop."""


def locate_tree(uri: str, tiers: list[Tier]) -> Located:
    """Where an import's tree lies: anywhere under a tier, the tier's root included."""
    parsed = parse_url(uri, field_name="uri")
    for tier in tiers:
        root = tier.parsed
        if (parsed.scheme, parsed.bucket, parsed.path.strip("/")) == (
            root.scheme,
            root.bucket,
            root.path.strip("/"),
        ):
            return Located(tier=tier, uri=root.join(""), key="")
    return locate(uri, tiers)


def create_import(
    session: Session,
    request: ImportRequest,
    *,
    tiers: list[Tier],
    storages: StorageRegistry,
    actor: str,
    owner: str,
    lease: timedelta,
    now: datetime,
) -> ImportRow:
    """Check the request against the tiers and the catalog, then record it `running`,
    claimed by `owner`. The tree must lie under a tier (422), not inside a catalogued
    checkpoint (409: all it holds would overlap), and its store must answer (503)."""
    if request.layout != AUTO and request.layout not in LAYOUTS:
        raise Invalid(f"must be auto or one of {', '.join(LAYOUTS)}", field="layout")
    located = locate_tree(request.uri, tiers)
    inside = _catalogued_above(session, located.uri) if located.key else None
    if inside is not None:
        raise Conflict(
            inside.describe(located.uri), field="uri", checkpoint_id=inside.checkpoint_id
        )
    try:
        present = storages.storage_for(located.tier).prefix_exists(located.key)
    except StorageError as error:
        raise Unavailable(f"could not list {located.uri!r}: {error}", field="uri") from None
    if not present:
        raise NotFound(f"nothing is stored under {located.uri!r}", field="uri")
    row = ImportRow(
        id=new_id("imp"),
        uri=located.uri,
        tier=located.tier.name,
        project=request.project,
        layout=request.layout,
        run=request.run,
        klass=request.klass,
        dry_run=request.dry_run,
        active=request.active,
        state=RUNNING,
        listed=0,
        discovered=0,
        registered=0,
        existing=0,
        runs=0,
        unrecognized=0,
        incomplete_count=0,
        skipped_count=0,
        incomplete=[],
        skipped=[],
        unrecognized_sample=[],
        bytes_registered=0,
        owner=owner,
        lease_until=now + lease,
        created_at=now,
        updated_at=now,
        created_by=actor,
    )
    session.add(row)
    session.flush()
    return row


def _catalogued_above(session: Session, uri: str) -> Overlap | None:
    """A live checkpoint whose location is the tree or holds it: all the tree holds
    would lie inside it."""
    row = session.execute(
        select(Location.checkpoint_id, Location.uri)
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(Location.uri.in_(ancestors(uri)), Checkpoint.state.in_(LIVE_STATES))
        .limit(1)
    ).first()
    return None if row is None else Overlap(row[0], row[1])


def get_import(session: Session, import_id: str) -> ImportRow:
    row = session.get(ImportRow, import_id) if "\x00" not in import_id else None
    if row is None:
        raise NotFound(f"no import has id {import_id!r}", field="import_id")
    return row


def list_imports(
    session: Session, *, limit: int, cursor: str | None
) -> tuple[list[ImportRow], str | None]:
    """Newest first."""
    stmt = select(ImportRow).order_by(ImportRow.id.desc()).limit(limit + 1)
    if cursor is not None:
        stmt = stmt.where(ImportRow.id < decode_cursor(cursor, str)[0])
    rows = list(session.execute(stmt).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].id) if more else None


def list_items(
    session: Session, import_id: str, *, limit: int, cursor: str | None
) -> tuple[list[ImportItem], str | None]:
    """What the import registered (or would), in the order it found them."""
    stmt = (
        select(ImportItem)
        .where(ImportItem.import_id == import_id)
        .order_by(ImportItem.id)
        .limit(limit + 1)
    )
    if cursor is not None:
        stmt = stmt.where(ImportItem.id > decode_cursor(cursor, int)[0])
    rows = list(session.execute(stmt).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].id) if more else None


@dataclass(slots=True)
class Progress:
    """What one stretch of the listing added, up to `cursor` (every key at or before it is
    accounted for)."""

    cursor: str | None
    listed: int = 0
    discovered: int = 0
    unrecognized: int = 0
    incomplete: list[tuple[str, str]] | None = None
    unrecognized_keys: list[str] | None = None


def record_progress(
    session: Session,
    import_id: str,
    owner: str,
    progress: Progress,
    outcome: Outcome,
    *,
    lease: timedelta,
    now: datetime,
) -> None:
    """Fold a batch into the import's counters and renew the claim, in the transaction
    that registered it. Raises LostLease when the import is no longer `owner`'s."""
    row = session.execute(
        select(ImportRow).where(ImportRow.id == import_id).with_for_update()
    ).scalar_one()
    if row.owner != owner or row.state != RUNNING:
        raise LostLease(import_id)
    incomplete = progress.incomplete or []
    row.listed += progress.listed
    row.discovered += progress.discovered
    row.unrecognized += progress.unrecognized
    row.registered += len(outcome.registered)
    row.bytes_registered += sum(c.size_bytes for c in outcome.registered)
    row.existing += outcome.existing
    row.runs += outcome.new_runs
    row.incomplete_count += len(incomplete)
    row.skipped_count += len(outcome.skipped)
    if incomplete and len(row.incomplete) < REPORTED:
        room = REPORTED - len(row.incomplete)
        row.incomplete = [*row.incomplete, *({"key": k, "reason": r} for k, r in incomplete[:room])]
    if outcome.skipped and len(row.skipped) < REPORTED:
        room = REPORTED - len(row.skipped)
        skipped = outcome.skipped[:room]
        row.skipped = [*row.skipped, *({"key": k, "reason": r} for k, r in skipped)]
    keys = progress.unrecognized_keys or []
    if keys and len(row.unrecognized_sample) < UNRECOGNIZED_SAMPLE:
        room = UNRECOGNIZED_SAMPLE - len(row.unrecognized_sample)
        row.unrecognized_sample = [*row.unrecognized_sample, *keys[:room]]
    row.cursor = progress.cursor
    row.updated_at = now
    row.lease_until = now + lease


def finish(
    session: Session,
    import_id: str,
    owner: str,
    *,
    now: datetime,
    error: str | None = None,
    sweep_id: str | None = None,
) -> None:
    """`done`, or `failed` with `error`; the claim is released."""
    session.execute(
        update(ImportRow)
        .where(ImportRow.id == import_id, ImportRow.owner == owner, ImportRow.state == RUNNING)
        .values(
            state=FAILED if error is not None else DONE,
            error=error,
            sweep_id=sweep_id,
            finished_at=now,
            updated_at=now,
            owner=None,
            lease_until=None,
        )
    )


def claim_abandoned(session: Session, owner: str, *, lease: timedelta, now: datetime) -> list[str]:
    """Take over the running imports whose claim has lapsed (their process died)."""
    ids = list(
        session.execute(
            select(ImportRow.id).where(ImportRow.state == RUNNING, ImportRow.lease_until < now)
        ).scalars()
    )
    claimed = []
    for import_id in ids:
        taken = session.execute(
            update(ImportRow)
            .where(
                ImportRow.id == import_id,
                ImportRow.state == RUNNING,
                ImportRow.lease_until < now,
            )
            .values(owner=owner, lease_until=now + lease, updated_at=now)
        )
        if taken.rowcount:  # type: ignore[attr-defined]
            claimed.append(import_id)
    return claimed


def renew(session: Session, import_id: str, owner: str, *, lease: timedelta, now: datetime) -> None:
    """Keep the claim through a long stretch with nothing to write. Raises LostLease."""
    kept = session.execute(
        update(ImportRow)
        .where(ImportRow.id == import_id, ImportRow.owner == owner, ImportRow.state == RUNNING)
        .values(lease_until=now + lease)
    )
    if not kept.rowcount:  # type: ignore[attr-defined]
        raise LostLease(import_id)
