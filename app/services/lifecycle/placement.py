"""Where a location's files are, and the only way the worker removes one.

A checkpoint is a prefix (a directory of files) or one object (a single-file checkpoint,
`*.ckpt`, `*.safetensors`): its manifest paths are then relative to the object's parent,
and removing the location removes that one object, never its siblings. Before removing
anything the worker asks the catalog whether another live checkpoint owns bytes there.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.domain.tier import Tier
from app.services.catalog.overlap import find_overlap
from app.storage.base import PermanentError, Storage


class Overlapping(PermanentError):
    """Removing or writing there would touch another live checkpoint's bytes."""


def files_base(key: str, single_file: bool) -> str:
    """The prefix the manifest's paths are relative to."""
    if not single_file:
        return key
    return key.rsplit("/", 1)[0] if "/" in key else ""


def placed_uri(tier: Tier, project: str, run_name: str, step: int, name: str | None) -> str:
    """Where the service writes a checkpoint on `tier`: its step prefix, and for a
    single-file checkpoint (`name` given) that file under it."""
    step_prefix = f"{project}/{run_name}/step-{step}"
    return tier.parsed.join(f"{step_prefix}/{name}" if name else step_prefix)


def refuse_if_overlapping(session: Session, uri: str, checkpoint_id: str, doing: str) -> None:
    """Overlapping (permanent: the action fails with it) when `uri` equals, contains or
    lies inside a location of another live checkpoint."""
    found = find_overlap(session, uri, exclude_checkpoint=checkpoint_id)
    if found is not None:
        raise Overlapping(f"refusing to {doing} {uri}: {found.describe(uri)}")


def remove_location(
    storage: Storage, key: str, single_file: bool, *, committed: bool = True
) -> int:
    """Delete a location's bytes: the one object, or everything under the prefix. A location
    of a save that never `committed` (an aborted reservation) goes as `_remove_reservation`
    says."""
    if not committed:
        return _remove_reservation(storage, key)
    if single_file:
        return storage.delete_keys([key])
    return storage.delete_prefix(key)


def _remove_reservation(storage: Storage, key: str) -> int:
    """Delete what a save that never committed left: its uri as a prefix or as one object
    (it never said which), and the multipart uploads it left unfinished under it."""
    removed = storage.delete_prefix(key)
    storage.abort_uploads(key)
    if storage.head(key) is not None:  # one object of that name (on an object store)
        removed += storage.delete_keys([key])
    return removed
