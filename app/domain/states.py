"""The states and kinds the catalog and the ledger speak in (DESIGN.md section 3).

StrEnums, so a member is its wire value: it compares equal to the string, serialises as
it in JSON and binds as it in SQL, and the API and database stay exactly as they were."""

from __future__ import annotations

from enum import StrEnum


class CheckpointState(StrEnum):
    WRITING = "writing"  # reserved by an asynchronous save that has not committed yet
    ACTIVE = "active"
    TRASHED = "trashed"  # the bytes stay until the purge
    DELETED = "deleted"


class RunStatus(StrEnum):
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"


class ActionKind(StrEnum):
    DELETE = "delete"  # to the trash
    PURGE = "purge"  # the bytes themselves, once the trash period is over
    MOVE = "move"
    COPY = "copy"
    RESTORE = "restore"


class ActionState(StrEnum):
    HELD = "held"  # beyond the blast radius: waits for a person's approval
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class LocationRole(StrEnum):
    PRIMARY = "primary"
    REPLICA = "replica"


# An action not yet ended: a checkpoint gets no second one of the same kind and target.
OPEN_STATES = (ActionState.HELD, ActionState.PENDING, ActionState.RUNNING)
FINAL_STATES = (ActionState.DONE, ActionState.FAILED, ActionState.CANCELLED)
# Checkpoints whose locations are someone's bytes: no other checkpoint may overlap them.
LIVE_STATES = (CheckpointState.WRITING, CheckpointState.ACTIVE, CheckpointState.TRASHED)
# Checkpoints whose catalogued files must exist, and whose bytes are billed.
STORED_STATES = (CheckpointState.ACTIVE, CheckpointState.TRASHED)
