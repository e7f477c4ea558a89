"""When a plan's saving starts on a tier whose provider keeps billing deleted bytes (GCS soft
delete, noncurrent versions a lifecycle rule expires; DESIGN section 16).

A plan's `usd_month` is the monthly change once the bytes are gone from the bill; on such a
tier that is not at the purge (or a move's source removal) but a window later, or never
while old versions stay. The figure stays the same; the reason says when it comes, so a
person weighing a delete does not count on money a week early. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from app.domain.duration import format_duration
from app.domain.plan import CheckpointSnapshot, PlannedAction

DAY = timedelta(days=1)


def saving_starts(
    action: PlannedAction,
    checkpoint: CheckpointSnapshot,
    billed_after_delete: Mapping[str, timedelta | None],
    now: datetime,
    trash_retention: timedelta | None,
) -> str | None:
    """What to add to the reason of a planned delete or move when a tier it frees keeps
    billing deleted bytes (`billed_after_delete`: tier -> window, None for ever; a tier
    missing forgets at once); None when the saving starts as the bytes go.

    A delete frees every location at its purge, `trash_retention` after now (None: unknown,
    the note then counts from the purge); a move frees its source at once."""
    if action.kind == "delete":
        freed = sorted(checkpoint.tiers | ({checkpoint.tier} if checkpoint.tier else set()))
        removed_at = None
        after = "after the purge"
        if trash_retention is not None:
            removed_at = now + trash_retention
            kept = _duration(trash_retention)
            after += f" ({removed_at:%Y-%m-%d}, after {kept} in the trash)"
    elif action.kind == "move" and action.from_tier is not None:
        freed = [action.from_tier]
        removed_at = now
        after = "after the move"
    else:
        return None
    notes = []
    for tier in freed:
        window = billed_after_delete.get(tier, timedelta(0))
        if window is None:
            notes.append(
                f"{tier} keeps the deleted bytes as old versions nothing expires (keep_versions "
                f"without noncurrent_expiry): the saving on {tier} never comes until someone "
                "removes them"
            )
        elif window > timedelta(0):
            starts = f"{removed_at + window:%Y-%m-%d}" if removed_at is not None else "only then"
            notes.append(
                f"{tier} keeps deleted bytes billed for {_duration(window)} {after}: the saving "
                f"on {tier} starts {starts}"
            )
    return "; ".join(notes) or None


def _duration(value: timedelta) -> str:
    """Whole days as days (`7d`, not `1w`: retention settings are stated in days)."""
    if value % DAY == timedelta(0):
        return f"{value // DAY}d"
    return format_duration(value)
