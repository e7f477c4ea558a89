"""Reconciliation: compare what each tier holds with what the catalog says it holds.

Two findings (DESIGN section 6, `GET /v1/reconcile`):

- an *orphan* is an object under a tier that no checkpoint owns: not under the prefix of any
  catalogued location, of a `writing` checkpoint's uri, nor of an open action's source or
  destination. A crashed purge or an abandoned upload leaves them. They are only reported;
  an admin deletes them explicitly (`delete_orphans`), and only those a fresh scan still
  finds orphaned and older than a grace period (a job may write before it registers);
- *drift* is a catalogued file that is missing, or whose size or checksum differs from the
  manifest, or a location that overlaps another live checkpoint's (problem `overlap`,
  naming the other: a catalog written before locations were kept apart may hold such
  pairs; purges refuse to delete there). The checkpoint's `health` becomes `drift` (and
  back to `ok` once a scan finds it whole again), a warning is logged and the metrics
  count it.

A scan lists every tier first and reads the catalog after, so whatever is catalogued while
the listing runs is owned by the time objects are judged; a file that seems missing is
looked up again before it is called drift (it may have arrived after the listing).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db.dialect import try_session_lock
from app.db.models import Action, Checkpoint, Location
from app.db.session import session_scope
from app.domain.access import RECONCILE_ACTOR
from app.domain.states import LIVE_STATES, OPEN_STATES, STORED_STATES, CheckpointState
from app.domain.tier import Tier
from app.services.catalog.overlap import overlapping_pairs
from app.services.lifecycle.health import record_health
from app.services.lifecycle.reconcile_report import Drift, Orphan, Report
from app.storage.base import (
    MANIFEST_CHECKSUMS,
    ArchivedObject,
    ObjectInfo,
    ObjectMissing,
    Storage,
)
from app.storage.registry import StorageRegistry
from app.storage.transfer import compute_digests

log = logging.getLogger("app.reconcile")

ORPHAN_GRACE = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class _Catalogued:
    checkpoint_id: str
    tier: str
    uri: str  # the location's prefix, or its one object
    files: list[dict[str, object]] | None
    single_file: bool = False

    def file_uri(self, path: object) -> str:
        return self.uri if self.single_file else f"{self.uri}/{path}"


def _strip(uri: str) -> str:
    return uri.rstrip("/")


def _owned(uri: str, prefixes: set[str]) -> bool:
    """Whether `uri` is one of the prefixes or lies under one ('/'-separated)."""
    candidate = uri
    while True:
        if candidate in prefixes:
            return True
        cut = candidate.rfind("/")
        if cut <= len("file://"):
            return False
        candidate = candidate[:cut]


def _storage_groups(tiers: list[Tier]) -> dict[str, list[Tier]]:
    """Tiers by url: two tiers may share one bucket prefix in two classes; list it once."""
    groups: dict[str, list[Tier]] = defaultdict(list)
    for tier in tiers:
        groups[_strip(tier.url)].append(tier)
    return groups


def _list_tier(storage: Storage) -> list[ObjectInfo]:
    try:
        return storage.list_prefix("")
    except ObjectMissing:
        return []


def _catalog(
    session: Session,
) -> tuple[list[_Catalogued], set[str], list[tuple[str, str, str]]]:
    """Live locations with their manifests, every prefix something owns, and every
    location of a `writing`, `active` or `trashed` checkpoint (checkpoint, tier, uri)."""
    owned: set[str] = set()
    live: list[_Catalogued] = []
    placed: list[tuple[str, str, str]] = []
    rows = session.execute(
        select(Location.checkpoint_id, Location.tier, Location.uri, Checkpoint.state)
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(Checkpoint.state.in_(LIVE_STATES))
    ).all()
    files: dict[str, tuple[list[dict[str, object]] | None, bool]] = {
        checkpoint_id: (manifest, single_file)
        for checkpoint_id, manifest, single_file in session.execute(
            select(Checkpoint.id, Checkpoint.files, Checkpoint.single_file).where(
                Checkpoint.state.in_(STORED_STATES)
            )
        )
    }
    for checkpoint_id, tier, uri, state in rows:
        owned.add(_strip(uri))
        placed.append((checkpoint_id, tier, _strip(uri)))
        if state in STORED_STATES:
            manifest, single_file = files.get(checkpoint_id, (None, False))
            live.append(_Catalogued(checkpoint_id, tier, _strip(uri), manifest, single_file))
    for (uri,) in session.execute(
        select(Checkpoint.uri).where(Checkpoint.state == CheckpointState.WRITING)
    ):
        owned.add(_strip(uri))
    for source, dest in session.execute(
        select(Action.source_uri, Action.dest_uri).where(Action.state.in_(OPEN_STATES))
    ):
        owned.update(_strip(u) for u in (source, dest) if u)
    return live, owned, placed


def _checksum_problem(expected: dict[str, object], found: Mapping[str, str]) -> str | None:
    for name in MANIFEST_CHECKSUMS:
        want, have = expected.get(name), found.get(name)
        if isinstance(want, str) and have is not None and want.lower() != have.lower():
            return f"{name}: catalogued {want}, found {have}"
    return None


def _read_checksums(storage: Storage, key: str, names: list[str]) -> dict[str, str]:
    """Digest an object's bytes: a deep scan, for tiers that report no checksum (local
    directories) or not the manifest's. An archived object cannot be read: not checked."""
    try:
        return compute_digests(storage, key, names)
    except (ArchivedObject, ObjectMissing):
        return {}


def scan(
    factory: sessionmaker[Session],
    tiers: list[Tier],
    *,
    storages: StorageRegistry,
    deep: bool = False,
) -> Report:
    """One read-only pass over every tier and the catalog. Checksums are compared where the
    provider reports them; `deep` also reads the bytes of the files where it does not."""
    report = Report()
    listed: dict[str, dict[str, ObjectInfo]] = {}  # url -> absolute uri -> info
    by_name = {t.name: t for t in tiers}
    groups = _storage_groups(tiers)
    for url, group in groups.items():
        try:
            found = _list_tier(storages.storage_for(group[0]))
        except Exception as error:
            for member in group:
                report.unreachable[member.name] = f"{type(error).__name__}: {error}"
            continue
        listed[url] = {group[0].parsed.join(o.key): o for o in found}
        report.scanned_objects += len(found)
    with session_scope(factory) as session:
        live, owned, placed = _catalog(session)

    seen_uris: set[str] = set()
    for url, objects in listed.items():
        first = groups[url][0]
        base = _strip(first.parsed.join(""))
        for uri, info in objects.items():
            if uri in seen_uris or _owned(uri, owned):
                continue
            seen_uris.add(uri)  # a nested tier's objects are listed twice
            key = uri[len(base) :].lstrip("/")
            report.orphans.append(Orphan(first.name, key, uri, info.size_bytes, info.modified))

    for place in live:
        owner = by_name.get(place.tier)
        if owner is None or _strip(owner.url) not in listed or not place.files:
            continue
        present = listed[_strip(owner.url)]
        base = _strip(owner.parsed.join(""))
        for entry in place.files:
            uri = place.file_uri(entry["path"])
            key = uri[len(base) :].lstrip("/")
            problem = _problem(entry, present.get(uri), storages.storage_for(owner), key, deep)
            if problem is not None:
                report.drift.append(Drift(place.checkpoint_id, place.tier, key, uri, problem))
    report.drift.extend(_overlaps(placed, by_name))
    report.orphans.sort(key=lambda o: (o.tier, o.key))
    return report


def _overlaps(placed: list[tuple[str, str, str]], tiers: Mapping[str, Tier]) -> list[Drift]:
    """Both sides of every pair of overlapping locations, each naming the other."""
    tier_of = {(cid, uri): tier for cid, tier, uri in placed}
    found: list[Drift] = []
    seen: set[tuple[str, str, str, str]] = set()
    for inner, inner_uri, outer, outer_uri in overlapping_pairs((c, u) for c, _, u in placed):
        for cid, uri, other, other_uri in (
            (inner, inner_uri, outer, outer_uri),
            (outer, outer_uri, inner, inner_uri),
        ):
            if (cid, uri, other, other_uri) in seen:
                continue
            seen.add((cid, uri, other, other_uri))
            tier = tier_of[(cid, uri)]
            owner = tiers.get(tier)
            base = _strip(owner.parsed.join("")) if owner is not None else ""
            key = uri[len(base) :].lstrip("/") if base and uri.startswith(base) else uri
            found.append(Drift(cid, tier, key, uri, "overlap", other, other_uri))
    return found


def _problem(
    entry: dict[str, object], seen: ObjectInfo | None, storage: Storage, key: str, deep: bool
) -> str | None:
    if seen is None:
        seen = storage.head(key)  # it may have arrived after the listing
        if seen is None:
            return "missing"
    expected = entry.get("size_bytes")
    if isinstance(expected, int) and seen.size_bytes != expected:
        return f"size: catalogued {expected} bytes, found {seen.size_bytes}"
    problem = _checksum_problem(entry, seen.checksums)
    unchecked = [n for n in MANIFEST_CHECKSUMS if n in entry and n not in seen.checksums]
    if problem is None and deep and unchecked:
        problem = _checksum_problem(entry, _read_checksums(storage, key, unchecked))
    return problem


RECONCILE_LOCK_KEY = 0x636B7074_7265636E  # "ckptrecn"


def turn(factory: sessionmaker[Session]) -> AbstractContextManager[bool]:
    """Whether this process may reconcile now: on PostgreSQL, several schedulers' periodic
    scans would only repeat each other's listings, so one runs and the others skip."""
    return try_session_lock(factory, RECONCILE_LOCK_KEY)


def reconcile(
    factory: sessionmaker[Session],
    tiers: list[Tier],
    *,
    storages: StorageRegistry,
    deep: bool = False,
    actor: str = RECONCILE_ACTOR,
) -> Report:
    """Scan, then record the checkpoints' health: the scheduled job and `GET /v1/reconcile`."""
    report = scan(factory, tiers, storages=storages, deep=deep)
    record_health(factory, report, actor=actor, now=datetime.now(UTC))
    log.info(
        "reconciled",
        extra={
            "objects": report.scanned_objects,
            "orphans": len(report.orphans),
            "drift": len(report.drift),
            "unreachable": sorted(report.unreachable),
        },
    )
    return report


def delete_orphans(
    factory: sessionmaker[Session],
    tiers: list[Tier],
    wanted: Iterable[tuple[str, str]] | None,
    *,
    storages: StorageRegistry,
    now: datetime,
    grace: timedelta = ORPHAN_GRACE,
) -> tuple[list[Orphan], list[tuple[str, str, str]]]:
    """Delete orphans an admin named (`(tier, key)` pairs; None: every orphan), but only
    those a fresh scan still finds orphaned and last written before `now - grace`.
    Returns the deleted ones and the refused ones with why."""
    report = scan(factory, tiers, storages=storages)
    current = {(o.tier, o.key): o for o in report.orphans}
    names = list(current) if wanted is None else list(dict.fromkeys(wanted))
    deleted: list[Orphan] = []
    refused: list[tuple[str, str, str]] = []
    by_tier: dict[str, list[Orphan]] = defaultdict(list)
    for tier_name, key in names:
        orphan = current.get((tier_name, key))
        if orphan is None:
            refused.append((tier_name, key, "not an orphan (owned, gone, or unknown tier)"))
        elif orphan.modified is not None and orphan.modified > now - grace:
            refused.append((tier_name, key, f"written less than {grace} ago"))
        else:
            by_tier[tier_name].append(orphan)
    tiers_by_name = {t.name: t for t in tiers}
    for tier_name, orphans in by_tier.items():
        storages.storage_for(tiers_by_name[tier_name]).delete_keys(o.key for o in orphans)
        deleted.extend(orphans)
        log.info(
            "orphans deleted",
            extra={"tier": tier_name, "objects": len(orphans), "keys": [o.key for o in orphans]},
        )
    return deleted, refused


__all__ = [
    "Drift",
    "Orphan",
    "Report",
    "delete_orphans",
    "reconcile",
    "record_health",
    "scan",
    "turn",
]
