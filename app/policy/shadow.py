"""What a shadow policy sees of a run (DESIGN section 17): the catalog as if its own earlier
would-be actions had been carried out. A checkpoint it would have deleted is gone, one it
would have moved is on the tier it moved it to (policies only demote, so of several moves
the coldest stands), and a copy adds its tier. Everything else is the catalog as it is: the
real checkpoints, pins, protections and what the policy in force did to them. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.domain.plan import CheckpointSnapshot


@dataclass(slots=True)
class Overlay:
    """One checkpoint's would-be changes, as far as a shadow policy took it."""

    deleted: bool = False
    moved_to: str | None = None
    copies: set[str] = field(default_factory=set)

    def add(self, kind: str, to_tier: str | None, ranks: Mapping[str, int]) -> None:
        if kind == "delete":
            self.deleted = True
        elif kind == "move" and to_tier is not None:
            colder = self.moved_to is None or ranks.get(to_tier, -1) > ranks.get(self.moved_to, -1)
            self.moved_to = to_tier if colder else self.moved_to
        elif kind == "copy" and to_tier is not None:
            self.copies.add(to_tier)


def overlays(
    done: Iterable[tuple[str, str, str | None]], ranks: Mapping[str, int]
) -> dict[str, Overlay]:
    """Per checkpoint, the overlay of would-be actions given as (checkpoint, kind, to_tier)."""
    found: dict[str, Overlay] = {}
    for checkpoint_id, kind, to_tier in done:
        found.setdefault(checkpoint_id, Overlay()).add(kind, to_tier, ranks)
    return found


def seen(
    checkpoints: Sequence[CheckpointSnapshot], overlay: Mapping[str, Overlay]
) -> list[CheckpointSnapshot]:
    """The run's live checkpoints as the shadow policy would have left them."""
    if not overlay:
        return list(checkpoints)
    view: list[CheckpointSnapshot] = []
    for c in checkpoints:
        o = overlay.get(c.id)
        if o is None:
            view.append(c)
            continue
        if o.deleted:
            continue
        tier, tiers = c.tier, set(c.tiers)
        if o.moved_to is not None:
            tiers.discard(tier)
            tier = o.moved_to
            tiers.add(tier)
        view.append(c._replace(tier=tier, tiers=frozenset(tiers | o.copies)))
    return view
