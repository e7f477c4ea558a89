"""The adapters' shared byte streams, on their own (the adapters' tests run them against
real servers)."""

from __future__ import annotations

import io

import google_crc32c
import pytest

from app.storage.base import StorageError
from app.storage.streams import BoundedReader, ObjectReader, is_seekable, read_up_to


class Trickle:
    """A reader that cannot seek and gives at most 3 bytes a read."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._inner.read(min(size, 3) if size >= 0 else 3)


class Whole:
    """A reader whose one read gives back the very bytes object it holds."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int = -1) -> bytes:
        data, self._data = self._data, b""
        return data


def test_read_up_to_reads_again_until_the_size_or_the_end() -> None:
    assert read_up_to(Trickle(b"abcdefgh"), 7) == b"abcdefg"  # type: ignore[arg-type]
    assert read_up_to(Trickle(b"abc"), 7) == b"abc"  # type: ignore[arg-type]
    assert read_up_to(io.BytesIO(b"abc"), 0) == b""
    data = b"x" * 1000
    assert read_up_to(Whole(data), 1000) is data  # type: ignore[arg-type]  # one read, no copy
    assert not is_seekable(Trickle(b""))
    assert is_seekable(io.BytesIO())


def test_bounded_reader_stops_at_its_size_and_rewinds() -> None:
    reader = io.BytesIO(b"head:0123456789:tail")
    reader.seek(5)
    window = BoundedReader(reader, 10, "upload x")

    assert window.seekable() and len(window) == 10
    assert window.read(4) == b"0123" and window.tell() == 4
    assert window.read() == b"456789"
    assert window.read(5) == b""  # the tail stays unseen
    window.rewind()
    assert window.tell() == 0 and window.read(100) == b"0123456789"
    assert window.seek(-3, io.SEEK_END) == 7 and window.read() == b"789"
    buffer = bytearray(4)
    window.seek(2)
    assert window.readinto(buffer) == 4 and bytes(buffer) == b"2345"


def test_bounded_reader_fails_as_soon_as_the_reader_ends_early() -> None:
    window = BoundedReader(Trickle(b"abcde"), 8, "upload x")  # type: ignore[arg-type]
    assert not window.seekable()
    with pytest.raises(io.UnsupportedOperation):
        window.seek(0)
    with pytest.raises(StorageError, match="upload x: the reader ended after 5 of 8 bytes"):
        window.read()


def ranges(data: bytes, asked: list[tuple[int, int | None]]) -> ObjectReader:
    def fetch(offset: int, count: int | None) -> bytes:
        asked.append((offset, count))
        return data[offset:] if count is None else data[offset : offset + count]

    crc = f"{google_crc32c.value(data):08x}"
    return ObjectReader(fetch, "read x", size=len(data), chunk_size=4, crc32c=crc)


def test_object_reader_fetches_ranges_of_at_most_a_chunk() -> None:
    asked: list[tuple[int, int | None]] = []
    assert ranges(b"0123456789", asked).readall() == b"0123456789"
    assert asked == [(0, 4), (4, 4), (8, 2)]

    asked.clear()
    with io.BufferedReader(ranges(b"0123456789", asked), 4) as stream:
        assert stream.read(3) + stream.read(3) + stream.read() == b"0123456789"


def test_object_reader_refuses_damaged_or_short_bytes_every_time() -> None:
    def damaged(offset: int, count: int | None) -> bytes:
        return b"01234X6789"[offset : offset + (count or 10)]

    crc = f"{google_crc32c.value(b'0123456789'):08x}"
    raw = ObjectReader(damaged, "read x", size=10, chunk_size=4, crc32c=crc)
    for _ in range(2):
        with pytest.raises(StorageError, match="crc32c"):
            raw.readall()

    short = ObjectReader(lambda offset, count: b"", "read x", size=10)
    with pytest.raises(StorageError, match="asked 10 bytes at 0, got 0"):
        short.read(10)


def test_object_reader_of_unknown_size_reads_a_body_in_order() -> None:
    body = io.BytesIO(b"a body of unknown length")
    closed: list[bool] = []
    raw = ObjectReader(
        lambda _offset, count: body.read(count), "read x", on_close=lambda: closed.append(True)
    )
    assert raw.read(7) == b"a body "
    assert raw.readall() == b"of unknown length"  # the rest in one call
    assert raw.read(5) == b""
    raw.close()
    raw.close()
    assert closed == [True]
