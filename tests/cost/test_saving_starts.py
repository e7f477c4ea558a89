"""When a planned delete's or move's saving starts on tiers that bill deleted bytes: the note
a plan adds to the action's reason (app.cost.saving_start), worked from the dates by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.cost.saving_start import saving_starts
from app.domain.plan import CheckpointSnapshot, PlannedAction

NOW = datetime(2026, 12, 3, 13, 0, tzinfo=UTC)
WEEK = timedelta(days=7)
CHECKPOINT = CheckpointSnapshot(
    "c1", "r1", 1, "rolling", "active", 10, NOW, "hot", frozenset({"hot", "archive"})
)


def action(kind: str, to_tier: str | None = None) -> PlannedAction:
    return PlannedAction("c1", "r1", 1, kind, "hot", to_tier, "p/r", "r: why", 10)


def test_a_delete_saves_after_the_trash_and_the_tier_s_window() -> None:
    note = saving_starts(action("delete"), CHECKPOINT, {"hot": WEEK}, NOW, timedelta(days=3))
    assert note == (
        "hot keeps deleted bytes billed for 7d after the purge (2026-12-06, after 3d in the "
        "trash): the saving on hot starts 2026-12-13"
    )


def test_every_location_a_delete_frees_is_weighed() -> None:
    """The replica on archive too: old versions there are billed until someone removes them."""
    note = saving_starts(
        action("delete"), CHECKPOINT, {"hot": timedelta(0), "archive": None}, NOW, WEEK
    )
    assert note is not None and "hot" not in note
    assert note.endswith("the saving on archive never comes until someone removes them")


def test_a_move_frees_its_source_at_once() -> None:
    note = saving_starts(action("move", "cold"), CHECKPOINT, {"hot": WEEK, "cold": WEEK}, NOW, WEEK)
    assert note == (
        "hot keeps deleted bytes billed for 7d after the move: the saving on hot starts 2026-12-10"
    )


def test_nothing_to_add_where_the_bytes_go_at_once() -> None:
    assert saving_starts(action("delete"), CHECKPOINT, {}, NOW, WEEK) is None
    assert saving_starts(action("copy", "cold"), CHECKPOINT, {"hot": WEEK}, NOW, WEEK) is None
    assert saving_starts(action("move", "cold"), CHECKPOINT, {"archive": None}, NOW, WEEK) is None


def test_without_the_trash_retention_the_note_counts_from_the_purge() -> None:
    note = saving_starts(action("delete"), CHECKPOINT, {"hot": timedelta(hours=36)}, NOW, None)
    assert note == (
        "hot keeps deleted bytes billed for 36h after the purge: the saving on hot starts only then"
    )
