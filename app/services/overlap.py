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

from sqlalchemy import and_, literal, or_, select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Location
from app.domain.errors import Conflict

# A checkpoint whose bytes someone still counts on: reserved, active or in the trash.
LIVE = ("writing", "active", "trashed")


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


def escape_like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _under(uri: str, dialect: str):  # type: ignore[no-untyped-def]
    """Locations lying under `uri`, in a form the `ix_locations_uri` index answers."""
    if dialect == "postgresql":  # text_pattern_ops: a LIKE with a fixed prefix is a range
        return Location.uri.like(escape_like(uri) + "/%", escape="\\")
    # SQLite compares bytes: every string starting with "<uri>/" sorts in [<uri>/, <uri>0)
    return and_(Location.uri >= uri + "/", Location.uri < uri + "0")


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
    dialect = session.get_bind().dialect.name
    stmt = (
        select(Location.checkpoint_id, Location.uri)
        .join(Checkpoint, Checkpoint.id == Location.checkpoint_id)
        .where(
            Checkpoint.state.in_(LIVE),
            or_(Location.uri.in_(ancestors(uri)), _under(uri, dialect)),
        )
        .order_by(Location.id)
        .limit(1)
    )
    if exclude_checkpoint is not None:
        stmt = stmt.where(Location.checkpoint_id != exclude_checkpoint)
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
