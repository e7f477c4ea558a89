"""Provider limits are ours to enforce: the test servers accept what real providers refuse."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.storage import retry
from app.storage.base import TransientError
from app.storage.limits import (
    S3_MAX_OBJECT,
    S3_MAX_PART,
    S3_MAX_PARTS,
    S3_MIN_PART,
    GiB,
    MiB,
    TooLarge,
    batched,
    part_size_for,
    plan_parts,
)


@given(st.integers(min_value=0, max_value=S3_MAX_OBJECT), st.sampled_from([5, 8, 16, 64]))
def test_parts_cover_the_object_within_every_limit(size: int, preferred_mib: int) -> None:
    part = part_size_for(size, preferred_mib * MiB)
    count = -(-size // part) if size else 1

    assert count <= S3_MAX_PARTS
    assert S3_MIN_PART <= part <= S3_MAX_PART
    assert part >= preferred_mib * MiB


@pytest.mark.parametrize(
    "size", [0, 1, 16 * MiB, 16 * MiB + 1, 100 * GiB, 160 * GiB + 1, S3_MAX_OBJECT]
)
def test_planned_parts_are_contiguous_and_complete(size: int) -> None:
    parts = plan_parts(size)

    assert [p.number for p in parts] == list(range(1, len(parts) + 1))
    assert parts[0].offset == 0
    assert all(a.offset + a.size == b.offset for a, b in itertools.pairwise(parts))
    assert sum(p.size for p in parts) == size
    assert len(parts) <= S3_MAX_PARTS
    assert all(p.size >= S3_MIN_PART for p in parts[:-1])


def test_a_5_tib_object_needs_parts_larger_than_preferred() -> None:
    """16 MiB x 10,000 is 156 GiB: beyond that the part size must grow, not the count."""
    assert part_size_for(156 * GiB) == 16 * MiB
    assert part_size_for(157 * GiB) > 16 * MiB
    assert len(plan_parts(S3_MAX_OBJECT)) <= S3_MAX_PARTS


def test_objects_beyond_5_tib_are_refused() -> None:
    with pytest.raises(TooLarge):
        part_size_for(S3_MAX_OBJECT + 1)


def test_delete_batches_hold_at_most_1000_keys() -> None:
    keys = [f"k{i}" for i in range(2500)]
    chunks = list(batched(keys, 1000))
    assert [len(c) for c in chunks] == [1000, 1000, 500]
    assert [k for c in chunks for k in c] == keys


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap() -> None:
    for attempt in range(12):
        ceiling = min(retry.MAX_DELAY, retry.BASE_DELAY * 2**attempt)
        delays = [retry.backoff(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # jitter spreads over the whole range


def test_retrying_gives_up_after_its_attempts_and_retries_only_transient_errors() -> None:
    calls: list[int] = []
    slept: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("503 SlowDown")
        return "ok"

    assert retry.retrying(flaky, what="test", sleep=slept.append) == "ok"
    assert len(calls) == 3 and len(slept) == 2

    calls.clear()

    def always() -> None:
        calls.append(1)
        raise TransientError("503")

    with pytest.raises(TransientError):
        retry.retrying(always, what="test", attempts=4, sleep=slept.append)
    assert len(calls) == 4

    calls.clear()

    def broken() -> None:
        calls.append(1)
        raise ValueError("not transient")

    with pytest.raises(ValueError):
        retry.retrying(broken, what="test", sleep=slept.append)
    assert len(calls) == 1
