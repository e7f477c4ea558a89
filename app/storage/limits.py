"""Provider limits, enforced here because the test servers enforce none of them.

S3: a single CopyObject/PutObject carries at most 5 GiB; a multipart upload has at most
10,000 parts of 5 MiB to 5 GiB (the last may be smaller) and 5 TiB in all; DeleteObjects
takes at most 1,000 keys. GCS: a JSON batch request holds at most 100 calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

MiB = 1024 * 1024
GiB = 1024 * MiB

S3_MAX_SINGLE_COPY = 5 * GiB
S3_MAX_SINGLE_PUT = 5 * GiB
S3_MIN_PART = 5 * MiB
S3_MAX_PART = 5 * GiB
S3_MAX_PARTS = 10_000
S3_MAX_OBJECT = 5 * 1024 * GiB
S3_MAX_DELETE_KEYS = 1_000
GCS_MAX_BATCH_CALLS = 100

T = TypeVar("T")


class TooLarge(ValueError):
    """The object exceeds what the provider can hold."""


@dataclass(frozen=True, slots=True)
class Part:
    number: int  # 1-based, as S3 counts
    offset: int
    size: int


def part_size_for(size: int, preferred: int = 16 * MiB) -> int:
    """The smallest part size >= `preferred` (MiB-aligned) that fits `size` in 10,000 parts."""
    if size > S3_MAX_OBJECT:
        raise TooLarge(f"{size} bytes exceeds the 5 TiB object limit")
    part = max(preferred, S3_MIN_PART)
    needed = -(-size // S3_MAX_PARTS)
    if needed > part:
        part = -(-needed // MiB) * MiB
    return min(part, S3_MAX_PART)


def plan_parts(size: int, preferred: int = 16 * MiB) -> list[Part]:
    """Byte ranges covering `size`, within the part count and part size limits."""
    part = part_size_for(size, preferred)
    parts = [
        Part(number=i + 1, offset=offset, size=min(part, size - offset))
        for i, offset in enumerate(range(0, size, part))
    ]
    return parts or [Part(number=1, offset=0, size=0)]


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk
