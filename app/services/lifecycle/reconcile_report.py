"""What a reconciliation finds: objects no checkpoint owns (orphans), catalogued files
missing or changed (drift), and tiers it could not list."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

log = logging.getLogger("app.reconcile")

ORPHAN_GRACE = timedelta(hours=1)
READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Orphan:
    tier: str
    key: str  # relative to the tier's url
    uri: str
    size_bytes: int
    modified: datetime | None


@dataclass(frozen=True, slots=True)
class Drift:
    checkpoint_id: str
    tier: str
    key: str
    uri: str
    problem: str  # missing | overlap | size: ... | sha256: ... | crc32c: ...
    other_checkpoint_id: str | None = None  # overlap: the checkpoint it overlaps
    other_uri: str | None = None  # overlap: that checkpoint's location


@dataclass
class Report:
    orphans: list[Orphan] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    scanned_objects: int = 0
    unreachable: dict[str, str] = field(default_factory=dict)  # tier -> why it was skipped
