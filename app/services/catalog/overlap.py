"""Locations never overlap (DESIGN section 5): one checkpoint's bytes are never another's.

Two locations overlap when one uri equals the other or lies under it ('/'-separated), so
deleting one would delete some of the other. Sibling objects of one directory
(single-file checkpoints) do not overlap. Every registration checks this; every purge and
source removal checks it again before deleting anything (a catalog written before the
rule, or two registrations racing, may still hold an overlap), and reconciliation reports
the overlaps it finds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Subquery, and_, literal, select, union_all
from sqlalchemy.orm import Session

from app.db.dialect import byte_range
from app.db.models import Checkpoint, Location
from app.domain.errors import Conflict
from app.domain.states import LIVE_STATES  # reserved, active or in the trash


@dataclass(frozen=True, slots=True)
class Overlap:
    checkpoint_id: str  # the other checkpoint
    uri: str  # its location

    def describe(self, uri: str) -> str:
        if self.uri == uri:
            how = "is also the location of"
        elif self.uri.startswith(uri + "/"):
            how = "contains the location of"
        else:
            how = "lies inside the location of"
        return f"{uri!r} {how} checkpoint {self.checkpoint_id} ({self.uri!r})"


def _scheme_root(uri: str) -> int:
    """Length of the part of `uri` no checkpoint can be: `file:///` or `s3://bucket/`."""
    scheme_end = uri.find("://")
    if scheme_end < 0:
        return 0
    if uri.startswith("file://"):
        return len("file:///")
    slash = uri.find("/", scheme_end + 3)
    return len(uri) if slash < 0 else slash + 1


def ancestors(uri: str) -> list[str]:
    """`uri` and every uri it lies under, nearest first, down to the bucket or `/`."""
    uri = uri.rstrip("/")
    floor = _scheme_root(uri)
    found = [uri]
    cut = uri.rfind("/")
    while cut >= floor:
        candidate = uri[:cut]
        if len(candidate) < floor:
            break
        found.append(candidate)
        cut = candidate.rfind("/")
    return found


def _candidates(session: Session, uri: str) -> Subquery:
    """Locations equal to or above `uri`, and locations under it: two index range scans
    (`ix_locations_uri`), kept apart so that a prepared, generic plan uses the index too
    (an OR of the two, or a LIKE on a parameter, makes PostgreSQL scan the table)."""
    columns = (Location.id, Location.checkpoint_id, Location.uri)
    above = select(*columns).where(Location.uri.in_(ancestors(uri)))
    low, high = uri + "/", uri + "0"  # every "<uri>/..." sorts between these, byte by byte
    below = select(*columns).where(*byte_range(Location.uri, session, low, high))
    return union_all(above, below).subquery()


def find_overlap(
    session: Session,
    uri: str,
    *,
    exclude_checkpoint: str | None = None,
    exclude_step: tuple[str, int] | None = None,
) -> Overlap | None:
    """The first live checkpoint (other than the excluded one) with a location equal to,
    containing or inside `uri`; None when there is none. Two indexed lookups."""
    uri = uri.rstrip("/")
    found = _candidates(session, uri)
    stmt = (
        select(found.c.checkpoint_id, found.c.uri)
        .join(Checkpoint, Checkpoint.id == found.c.checkpoint_id)
        .where(Checkpoint.state.in_(LIVE_STATES))
        .order_by(found.c.id)
        .limit(1)
    )
    if exclude_checkpoint is not None:
        stmt = stmt.where(found.c.checkpoint_id != exclude_checkpoint)
    if exclude_step is not None:
        run_id, step = exclude_step
        stmt = stmt.where(~and_(Checkpoint.run_id == run_id, Checkpoint.step == literal(step)))
    row = session.execute(stmt).first()
    return None if row is None else Overlap(row[0], row[1])


def refuse_overlap(
    session: Session, uri: str, *, run_id: str, step: int, field: str = "uri"
) -> None:
    """Conflict (409) naming the other checkpoint when a new registration would overlap."""
    found = find_overlap(session, uri, exclude_step=(run_id, step))
    if found is not None:
        raise Conflict(found.describe(uri), field=field, checkpoint_id=found.checkpoint_id)


def overlapping_pairs(locations: Iterable[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """(checkpoint, uri, other checkpoint, other uri) for every pair of locations of two
    different checkpoints where the first lies inside or equals the second; pure, for
    reconciliation. Each equal pair appears in both orders."""
    by_uri: dict[str, list[str]] = {}
    for checkpoint_id, uri in locations:
        by_uri.setdefault(uri.rstrip("/"), []).append(checkpoint_id)
    pairs: list[tuple[str, str, str, str]] = []
    for uri, owners in by_uri.items():
        for candidate in ancestors(uri):
            others: Sequence[str] = by_uri.get(candidate, ())
            for owner in owners:
                for other in others:
                    if other != owner:
                        pairs.append((owner, uri, other, candidate))
    return pairs
