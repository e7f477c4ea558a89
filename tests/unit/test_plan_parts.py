"""A split plan's parts merged: the kept checkpoints a helper hands over already encoded
read, in the answer, exactly as the ones evaluated here, in the ranges' order."""

from __future__ import annotations

import pickle

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.api.plan_json import plan_document
from app.domain.plan import Kept
from app.services.lifecycle.plan_parts import (
    PIECE,
    PlanPart,
    encode_kept,
    kept_pieces,
    merge_parts,
)
from app.services.lifecycle.planning import CatalogPlan

kept_entries = st.lists(
    st.builds(
        Kept,
        checkpoint_id=st.text(min_size=1, max_size=12),
        step=st.integers(0, 10**9),
        reasons=st.lists(st.text(max_size=30), max_size=3).map(tuple),
    ),
    max_size=12,
)


def answered(plan: CatalogPlan) -> list[Kept]:
    document = orjson.loads(b"".join(plan_document(plan)))
    return [Kept(k["checkpoint_id"], k["step"], tuple(k["reasons"])) for k in document["kept"]]


@given(ranges=st.lists(st.tuples(kept_entries, st.booleans()), min_size=1, max_size=5))
def test_encoded_parts_answer_like_evaluated_ones_in_the_ranges_order(
    ranges: list[tuple[list[Kept], bool]],
) -> None:
    """Each range's part as a helper sends it (encoded or not, and through the pipe's
    pickling), merged: the answer lists every range's kept checkpoints in range order."""
    parts = []
    for kept, by_helper in ranges:
        part = PlanPart(kept=list(kept))
        if by_helper:
            encode_kept(part)
            assert part.kept == []
        parts.append(pickle.loads(pickle.dumps(part)))
    merged = merge_parts(parts)
    plan = CatalogPlan(kept=merged.kept, kept_json=merged.kept_json)
    assert answered(plan) == [k for kept, _ in ranges for k in kept]


def test_kept_pieces_hold_at_most_a_piece_of_entries_each() -> None:
    kept = [Kept(f"ckpt_{n}", n, ("keep_last 3",)) for n in range(2 * PIECE + 1)]
    pieces = list(kept_pieces(kept))
    assert len(pieces) == 3
    decoded = [orjson.loads(b"[" + piece + b"]") for piece in pieces]
    assert [len(d) for d in decoded] == [PIECE, PIECE, 1]
    last = 2 * PIECE
    (only,) = decoded[2]
    assert only == {"checkpoint_id": f"ckpt_{last}", "step": last, "reasons": ["keep_last 3"]}
