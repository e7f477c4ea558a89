"""A save of a step whose reservation was aborted: the job that reserved it died (or failed
the write), the scheduler or the job aborted it, and now a restarted job writes the same
step again, to the same place. Refusing it would leave that save out of the catalog for
good (the step is unique in its run); so the new save takes the reservation back, as an
undelete does, and goes on like any save of a reserved step (renewed, or committed).

Taking it back withdraws the purge queued for the old save's bytes in the same
transaction, so the worker never removes what the new save writes. A purge running right
now cannot be withdrawn: that save is refused (409), and the job's client catalogs nothing
rather than something about to lose its bytes.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Location
from app.domain.states import CheckpointState
from app.domain.tier import Tier, locate
from app.services.catalog.checkpoints import (
    DEFAULT_RESERVATION_TTL,
    AbortedStep,
    Registration,
    register_checkpoint,
)
from app.services.catalog.lookup import get_checkpoint
from app.services.catalog.overlap import refuse_overlap
from app.services.lifecycle.ledger import cancel_open
from app.services.lifecycle.requests import reserve_again
from app.storage.registry import StorageRegistry


def register_or_take_back(
    session: Session,
    *,
    tiers: list[Tier],
    storages: StorageRegistry,
    run_id: str,
    reg: Registration,
    actor: str,
    now: datetime,
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
) -> tuple[Checkpoint, bool]:
    """register_checkpoint, where the same step and uri of an aborted reservation take the
    reservation back first (see the module's docstring). Returns the checkpoint and whether
    a row was created (never, for one taken back)."""
    register = functools.partial(
        register_checkpoint,
        session,
        tiers=tiers,
        storages=storages,
        run_id=run_id,
        reg=reg,
        actor=actor,
        now=now,
        reservation_ttl=reservation_ttl,
    )
    try:
        return register()
    except AbortedStep as aborted:
        take_back(session, aborted.checkpoint_id, tiers, actor, now, now + reservation_ttl)
    return register()


def take_back(
    session: Session,
    checkpoint_id: str,
    tiers: list[Tier],
    actor: str,
    now: datetime,
    until: datetime,
) -> None:
    """An aborted reservation, trashed or already purged, is `writing` again until `until`."""
    checkpoint = get_checkpoint(session, checkpoint_id, for_update=True)
    if checkpoint.state == CheckpointState.TRASHED:
        cancel_open(
            session,
            checkpoint_id,
            "purge",
            now,
            actor=actor,
            busy="the bytes of this step's aborted save are being purged right now; "
            "save it again once the purge is done",
            why="withdrawn: the step is saved again",
        )
    else:  # deleted: its bytes and locations are gone, the new save writes them anew
        refuse_overlap(session, checkpoint.uri, run_id=checkpoint.run_id, step=checkpoint.step)
        located = locate(checkpoint.uri, tiers)
        checkpoint.locations.append(
            Location(
                checkpoint_id=checkpoint.id,
                tier=located.tier.name,
                uri=located.uri,
                storage_class=located.tier.storage_class,
                role="primary",
            )
        )
        checkpoint.tier = located.tier.name  # the row's tier is its primary's, always
    reserve_again(
        session,
        checkpoint,
        actor,
        now,
        until,
        event="reserved",
        reason="the step is saved again: its aborted reservation is taken back",
    )
