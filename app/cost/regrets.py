"""Regrets: what a policy would have removed that people then came back for (section 17).

A backtest's candidate and a shadow policy both answer the same question, so they share
this: a checkpoint the policy would have deleted, or moved to a colder tier, that was
later used. A use is a restore (a person's, or a job staging its resume point onto a
hotter tier: both are restore actions), a pin, or a run started with the checkpoint as its
`resumed_from`. A would-be delete regrets every later use; a would-be move regrets the
uses that read the bytes (a restore, a resume), not a pin, which reads nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

UseKind = Literal["restored", "pinned", "resumed_from"]
READS: frozenset[str] = frozenset({"restored", "resumed_from"})


@dataclass(frozen=True, slots=True)
class Use:
    checkpoint_id: str
    at: datetime
    use: UseKind


@dataclass(frozen=True, slots=True)
class WouldBe:
    """One action a policy would have taken: a delete, or a move to `to_tier`."""

    checkpoint_id: str
    run_id: str
    step: int
    kind: str  # delete | move (copies lose nothing and are never regretted)
    at: datetime
    to_tier: str | None = None


@dataclass(frozen=True, slots=True)
class Regret:
    checkpoint_id: str
    run_id: str
    step: int
    action: str  # delete | move
    to_tier: str | None
    would_delete_at: datetime  # when the policy would have deleted (or moved) it
    used_at: datetime
    use: UseKind


def find_regrets(would: Iterable[WouldBe], uses: Iterable[Use]) -> list[Regret]:
    """Each would-be delete or move paired with the first use after it that it spoils;
    ordered by use, then checkpoint. A checkpoint with both a would-be move and a later
    would-be delete is judged by the first of them that a use spoils."""
    by_checkpoint: dict[str, list[Use]] = {}
    for u in sorted(uses, key=lambda u: (u.at, u.use)):
        by_checkpoint.setdefault(u.checkpoint_id, []).append(u)
    found: dict[str, Regret] = {}
    for w in sorted(would, key=lambda w: w.at):
        if w.kind not in ("delete", "move") or w.checkpoint_id in found:
            continue
        for u in by_checkpoint.get(w.checkpoint_id, ()):
            if u.at > w.at and (w.kind == "delete" or u.use in READS):
                found[w.checkpoint_id] = Regret(
                    w.checkpoint_id, w.run_id, w.step, w.kind, w.to_tier, w.at, u.at, u.use
                )
                break
    return sorted(found.values(), key=lambda r: (r.used_at, r.checkpoint_id))
