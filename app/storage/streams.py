"""The byte streams both object adapters (S3, GCS) build their transfers from.

Neither provider library offers streams that behave as a transfer needs: a download whose
failures mid-body are ours to retry, an upload body that is exactly as long as announced,
a read that fills a part. These are the one implementation of each.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

import google_crc32c

from app.storage.base import StorageError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# (offset, count) -> at most `count` bytes from `offset`, or all the rest when count is None.
Fetch = Callable[[int, int | None], bytes]


def is_seekable(reader: object) -> bool:
    """Whether `reader` says it can seek. Readers handed to an upload may be any object
    with `read` (a stream from another provider, a digesting wrapper), so the method may be
    missing altogether."""
    seekable = getattr(reader, "seekable", None)
    return bool(callable(seekable) and seekable())


def read_up_to(reader: BinaryIO, size: int) -> bytes:
    """`size` bytes, fewer only where the stream ends. One read may return less than asked
    without being at the end (a socket, a digesting wrapper), so a caller cutting a stream
    into parts must read again; a single read that gives it all is returned as it came, with
    no copy (parts are 16 MiB)."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = reader.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ObjectReader(io.RawIOBase):
    """One object's bytes as a raw stream (wrapped in io.BufferedReader by the adapters),
    each read being one call to `fetch`.

    Why not the library's own stream: what it raises mid-body is the library's exceptions,
    while callers retry TransientError only; `fetch` translates (and may retry) them, so a
    body cut short is worth another try like any failed request. When `size` is known each
    read is a range of at most `chunk_size` bytes that `fetch` can retry on its own, which a
    library stream cannot do without losing its place, and memory stays near one chunk.
    Without `size`, reads follow one another from the start of a response body and an empty
    read is its end.

    A `crc32c` (hex, as stored) is checked when the end is reached; once the bytes are known
    bad every further read raises, so no caller mistakes damage for the end of the object.
    """

    def __init__(
        self,
        fetch: Fetch,
        what: str,
        *,
        size: int | None = None,
        chunk_size: int | None = None,
        crc32c: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._fetch = fetch
        self._what = what
        self._size = size
        self._chunk = chunk_size
        self._expected = crc32c
        self._crc = 0
        self._pos = 0
        self._on_close = on_close

    def readable(self) -> bool:
        return True

    def _took(self, data: bytes) -> None:
        if self._expected is not None:
            self._crc = int(google_crc32c.extend(self._crc, data))
        self._pos += len(data)

    def _at_end(self) -> None:
        actual = f"{self._crc:08x}"
        if self._expected is not None and actual != self._expected:
            raise StorageError(f"{self._what}: crc32c {actual} != stored {self._expected}")

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        count = len(view) if self._chunk is None else min(len(view), self._chunk)
        if self._size is not None:
            count = min(count, self._size - self._pos)
            if count <= 0:
                self._at_end()
                return 0
        data = self._fetch(self._pos, count)
        if len(data) > count or (not data and self._size is not None):
            raise StorageError(f"{self._what}: asked {count} bytes at {self._pos}, got {len(data)}")
        if not data:
            self._at_end()
            return 0
        view[: len(data)] = data
        self._took(data)
        return len(data)

    def readall(self) -> bytes:
        """RawIOBase's own reads 8 KiB at a time, which would be a request per 8 KiB. A body
        of unknown size is read whole in one call; ranges one chunk at a time."""
        if self._size is None:
            data = self._fetch(self._pos, None)
            self._took(data)
            self._at_end()
            return data
        parts: list[bytes] = []
        chunk = bytearray(self._chunk or max(self._size - self._pos, 1))
        while count := self.readinto(chunk):
            parts.append(bytes(chunk[:count]))
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed and self._on_close is not None:
            self._on_close()
        super().close()


class BoundedReader(io.RawIOBase):
    """Exactly `size` bytes of `reader` from its current position: the body of one upload.

    Why: a request body must be as long as announced, and the libraries cannot tell. botocore
    reads a body to its end (to sign it or checksum it), so the reader's bytes past `size`
    must stay unseen; GCS's uploads take a short read for the last chunk, and a server waits
    for the rest of a body short of its Content-Length. So reads stop at `size` and raise
    StorageError as soon as the reader ends early: a truncated object is never completed.

    `tell()` counts from 0, as GCS resumable uploads insist. Over a seekable reader it seeks
    within the window too, so an attempt can `rewind()` and botocore can re-read what it
    signed; over one that cannot seek it is read once.
    """

    def __init__(self, reader: BinaryIO, size: int, what: str) -> None:
        super().__init__()
        self._reader = reader
        self._start = reader.tell() if is_seekable(reader) else None
        self._size = size
        self._what = what
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._start is not None

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self._start is None:
            raise io.UnsupportedOperation(f"{self._what}: the reader cannot seek")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, min(self._size, base + offset))
        self._reader.seek(self._start + self._pos)
        return self._pos

    def rewind(self) -> None:
        self.seek(0)

    def read(self, size: int | None = -1) -> bytes:
        left = self._size - self._pos
        want = left if size is None or size < 0 else min(size, left)
        data = read_up_to(self._reader, want)
        if len(data) < want:
            raise StorageError(
                f"{self._what}: the reader ended after {self._pos + len(data)} of "
                f"{self._size} bytes (an upload whose reader ended early is never completed)"
            )
        self._pos += len(data)
        return data

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def __len__(self) -> int:
        return self._size
