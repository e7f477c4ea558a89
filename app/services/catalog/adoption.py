"""Registering an adopted tree's checkpoints a batch at a time (DESIGN section 14).

A batch costs a fixed number of statements, whatever its size: one lookup of the runs,
two of the catalogued locations the batch could meet (equal to or above its uris, and the
uri range it spans), one of the steps its runs already hold, then one multi-row insert
each of checkpoints, locations, audit events and import items. That is what lets an
import register thousands of checkpoints a second where one registration per HTTP call
pays a round trip each.

The rules are a registration's: a uri already catalogued is `existing` (importing twice
registers nothing new), one that contains or lies inside another live checkpoint's
location is skipped and reported, as is a step its run already holds at another uri. A
dry run applies the same rules, with this import's own items standing in for the
checkpoints it would have written, so it lists exactly what the real import registers.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from app.db.bulk import bulk_insert
from app.db.dialect import byte_range, one_of
from app.db.models import AuditEvent, Checkpoint, ImportItem, Location
from app.domain.ids import new_id
from app.domain.layouts import Candidate
from app.domain.states import LIVE_STATES
from app.services.catalog.adopted_runs import (
    Adoption,
    RunRow,
    chunks,
    ensure_runs,
    fold_into_runs,
)
from app.services.catalog.overlap import Overlap, ancestors


@dataclass(slots=True)
class Outcome:
    registered: list[Candidate] = field(default_factory=list)
    existing: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key, why)
    new_runs: int = 0  # runs that got their first checkpoint of this import


def adopt(
    session: Session, adoption: Adoption, batch: Sequence[Candidate], now: datetime
) -> Outcome:
    """Register what `batch` holds that the catalog does not (or, dry, work out what would
    be), in the session's transaction; the caller commits it with the import's counters."""
    outcome = Outcome()
    if not batch:
        return outcome
    runs = ensure_runs(session, adoption, batch, now)
    taken = _live_locations(session, [c.uri for c in batch])
    held = _held_steps(session, adoption, batch, runs)
    seen: dict[tuple[str, int], str] = {}
    ordered = sorted(taken)
    for candidate in batch:
        why = _refusal(candidate, taken, ordered, held, seen)
        if why == "existing":
            outcome.existing += 1
        elif why is not None:
            outcome.skipped.append((candidate.key, why))
        else:
            seen[(candidate.run, candidate.step)] = candidate.uri
            outcome.registered.append(candidate)
    ids: dict[str, str | None] = {c.uri: None for c in outcome.registered}
    if not adoption.dry_run and outcome.registered:
        written = _write(session, adoption, outcome.registered, runs, now)
        # a step a registration (or another import) took since the lookup is theirs
        taken_meanwhile = [c for c in outcome.registered if c.uri not in written]
        outcome.existing += len(taken_meanwhile)
        outcome.registered = [c for c in outcome.registered if c.uri in written]
        ids.update(written)
    outcome.new_runs = _count_new_runs(session, adoption, outcome.registered)
    items = [
        {
            "import_id": adoption.import_id,
            "run": c.run,
            "step": c.step,
            "class": adoption.klass,
            "uri": c.uri,
            "size_bytes": c.size_bytes,
            "created_at": c.created_at,
            "layout": c.layout,
            "checkpoint_id": ids[c.uri],
        }
        for c in outcome.registered
    ]
    bulk_insert(session, cast(Table, ImportItem.__table__), items)
    return outcome


# --- what is already there ------------------------------------------------------------------


def _live_locations(session: Session, uris: list[str]) -> dict[str, str]:
    """Live checkpoints' locations the batch could meet, uri -> checkpoint: those above one
    of `uris` (a few directories: the runs' and theirs), and those inside the range the
    batch spans, where every uri of the batch, and everything under one, lies. Two index
    scans whatever the batch's size, and neither needs the statistics of a table that the
    import itself is filling (a list of a thousand uris made the planner scan it whole)."""
    above = sorted({a for uri in uris for a in ancestors(uri)[1:]})
    live = Checkpoint.state.in_(LIVE_STATES)
    joined = select(Location.uri, Location.checkpoint_id).join(
        Checkpoint, Checkpoint.id == Location.checkpoint_id
    )
    found: dict[str, str] = {}
    for chunk in chunks(above):
        found.update(
            (u, c)
            for u, c in session.execute(
                joined.where(live, one_of(Location.uri, session, list(chunk)))
            )
        )
    low, high = min(uris), max(uri + "0" for uri in uris)
    inside = joined.where(live, *byte_range(Location.uri, session, low, high))
    found.update((u, c) for u, c in session.execute(inside))
    return found


def _held_steps(
    session: Session, adoption: Adoption, batch: Sequence[Candidate], runs: dict[str, RunRow]
) -> dict[tuple[str, int], str]:
    """(run name, step) -> uri of the steps the batch's runs already hold (and, for a dry
    run, the steps earlier batches of this import would have registered)."""
    names = {row.id: name for name, row in runs.items() if row.id is not None}
    steps = sorted({c.step for c in batch})
    held: dict[tuple[str, int], str] = {}
    for step_chunk in chunks(steps):
        for run_chunk in chunks(sorted(names)):
            rows = session.execute(
                select(Checkpoint.run_id, Checkpoint.step, Checkpoint.uri).where(
                    one_of(Checkpoint.run_id, session, list(run_chunk)),
                    one_of(Checkpoint.step, session, list(step_chunk)),
                )
            )
            held.update(((names[run_id], step), uri) for run_id, step, uri in rows)
        if adoption.dry_run:
            rows = session.execute(
                select(ImportItem.run, ImportItem.step, ImportItem.uri).where(
                    ImportItem.import_id == adoption.import_id,
                    one_of(ImportItem.run, session, sorted(runs)),
                    one_of(ImportItem.step, session, list(step_chunk)),
                )
            )
            held.update(((run, step), uri) for run, step, uri in rows)
    return held


def _refusal(
    candidate: Candidate,
    taken: dict[str, str],
    ordered: list[str],
    held: dict[tuple[str, int], str],
    seen: dict[tuple[str, int], str],
) -> str | None:
    """Why the candidate is not registered (`existing`, or a reason to report), or None."""
    uri = candidate.uri
    if uri in taken:
        return "existing"
    for above in ancestors(uri)[1:]:
        if above in taken:
            return Overlap(taken[above], above).describe(uri)
    at = bisect.bisect_left(ordered, uri + "/")
    if at < len(ordered) and ordered[at].startswith(uri + "/"):
        return Overlap(taken[ordered[at]], ordered[at]).describe(uri)
    step = (candidate.run, candidate.step)
    other = held.get(step) or seen.get(step)
    if other == uri:
        return "existing"
    if other is not None:
        return f"step {candidate.step} of run {candidate.run!r} is already registered at {other!r}"
    return None


def _count_new_runs(session: Session, adoption: Adoption, registered: list[Candidate]) -> int:
    names = sorted({c.run for c in registered})
    before: set[str] = set()
    for chunk in chunks(names):
        before.update(
            session.execute(
                select(ImportItem.run)
                .where(
                    ImportItem.import_id == adoption.import_id,
                    one_of(ImportItem.run, session, list(chunk)),
                )
                .distinct()
            ).scalars()
        )
    return len(set(names) - before)


# --- writing --------------------------------------------------------------------------------


def _write(
    session: Session,
    adoption: Adoption,
    registered: list[Candidate],
    runs: dict[str, RunRow],
    now: datetime,
) -> dict[str, str]:
    """Insert the checkpoints, their locations and audit events, and fold them into their
    runs' totals and times; returns uri -> checkpoint id of the ones inserted (a step a
    registration took meanwhile is left to it)."""
    tier = adoption.tier
    rows: list[dict[str, Any]] = [
        {
            "id": new_id("ckpt"),
            "run_id": runs[c.run].id,
            "step": c.step,
            "class": adoption.klass,
            "state": "active",
            "uri": c.uri,
            "tier": tier.name,
            "size_bytes": c.size_bytes,
            "files": orjson.Fragment(c.files),  # JSON already (Candidate.files)
            "metrics": c.metrics,
            "labels": {},
            "pinned": False,
            "single_file": c.single_file,
            "created_at": c.created_at,
            "registered_at": now,
            "committed_at": now,
            "created_by": adoption.actor,
            "updated_by": adoption.actor,
        }
        for c in registered
    ]
    table = cast(Table, Checkpoint.__table__)
    inserted = set(bulk_insert(session, table, rows, ignore_conflicts=True, returning="id"))
    rows = [row for row in rows if row["id"] in inserted]
    if not rows:
        return {}
    bulk_insert(
        session,
        cast(Table, Location.__table__),
        [
            {
                "checkpoint_id": row["id"],
                "tier": tier.name,
                "uri": row["uri"],
                "storage_class": tier.storage_class,
                "role": "primary",
            }
            for row in rows
        ],
    )
    events = [_registered(adoption, row, now) for row in rows]
    bulk_insert(session, cast(Table, AuditEvent.__table__), events)
    fold_into_runs(session, rows, runs)
    return {row["uri"]: row["id"] for row in rows}


def _registered(adoption: Adoption, row: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The `registered` audit event of one adopted checkpoint, as a registration writes
    it; built whole here (its values are plain already) rather than through
    audit.checkpoint_event, which a thousand times per batch costs more than the insert."""
    tier = adoption.tier.name
    return {
        "at": now,
        "actor": adoption.actor,
        "entity": "checkpoint",
        "entity_id": row["id"],
        "event": "registered",
        "checkpoint_id": row["id"],
        "run_id": row["run_id"],
        "before": None,
        "after": {
            "state": "active",
            "step": row["step"],
            "class": row["class"],
            "size_bytes": row["size_bytes"],
            "tier": tier,
            "locations": [{"tier": tier, "role": "primary", "uri": row["uri"]}],
        },
        "reason": f"adopted by import {adoption.import_id}",
    }
