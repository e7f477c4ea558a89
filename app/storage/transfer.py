"""Copying and verifying one checkpoint's files between two storages, by the cheapest path.

Within one provider the bytes never pass through this process (server-side copy, or a
class change in place); across providers they stream through it in bounded memory,
digested on the way so the manifest's checksums are checked without a second read.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import google_crc32c
from awscrt import checksums as crt_checksums

from app import metrics
from app.storage.base import MANIFEST_CHECKSUMS, ObjectInfo, Storage, join_key
from app.storage.retry import in_this_context

Entry = Mapping[str, Any]  # a manifest entry: path, size_bytes, optional checksums
READ_CHUNK = 1024 * 1024


_through = 0
_through_lock = threading.Lock()


def bytes_through() -> int:
    """Bytes this process has read from any storage while copying or verifying: a
    same-provider move or class change should leave it unchanged."""
    return _through


def _count_through(n: int) -> None:
    global _through
    with _through_lock:
        _through += n


class VerificationFailed(Exception):
    """A copy does not match the manifest; the source is kept."""


@dataclass
class TransferReport:
    files: int = 0
    skipped: int = 0  # already present and verified (a resumed transfer)
    bytes_streamed: int = 0  # bytes that passed through this process
    bytes_server_side: int = 0
    digests: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, streamed: int = 0, server_side: int = 0, skipped: bool = False) -> None:
        with self._lock:
            self.files += 1
            self.skipped += skipped
            self.bytes_streamed += streamed
            self.bytes_server_side += server_side


class DigestingReader:
    """Reads through to `inner`, digesting the bytes with the manifest's algorithms.

    Seekable when `inner` is, but only back over bytes already read: a retry, or a signer
    that reads a body and rewinds it, sees the same bytes again, and each byte is digested
    once, when the reading first gets past it. `count` is how far that is."""

    def __init__(
        self,
        inner: BinaryIO,
        algorithms: list[str],
        expected: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.expected = expected
        self.progress = progress  # told of each byte once, when first read
        self.sha256 = hashlib.sha256() if "sha256" in algorithms else None
        self.crc32c = (
            google_crc32c.Checksum()  # type: ignore[no-untyped-call]
            if "crc32c" in algorithms
            else None
        )
        # S3's CRC64NVME, from awscrt (botocore's own, for the same checksum)
        self.crc64nvme: int | None = 0 if "crc64nvme" in algorithms else None
        self.count = 0
        self.position = 0  # relative to where `inner` stood at the start
        self.start = inner.tell() if self.seekable() else 0

    def read(self, size: int | None = -1) -> bytes:
        data = self.inner.read(-1 if size is None else size)
        if not data and size != 0 and self.expected is not None and self.count < self.expected:
            raise VerificationFailed(
                f"the source ended after {self.count} bytes, the manifest says {self.expected}"
            )
        if data:
            start, self.position = self.position, self.position + len(data)
            _count_through(len(data))
            if self.position > self.count:
                fresh = data[self.count - start :] if start < self.count else data
                self.count = self.position
                if self.progress is not None:
                    self.progress(len(fresh))
                if self.sha256 is not None:
                    self.sha256.update(fresh)
                if self.crc32c is not None:
                    self.crc32c.update(fresh)  # type: ignore[no-untyped-call]
                if self.crc64nvme is not None:
                    self.crc64nvme = int(crt_checksums.crc64nvme(fresh, self.crc64nvme))
        return data

    def seekable(self) -> bool:
        seekable = getattr(self.inner, "seekable", None)
        return bool(callable(seekable) and seekable())

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.position + offset}.get(whence)
        if target is None or not 0 <= target <= self.count or not self.seekable():
            raise OSError("a digesting reader seeks only back over bytes it has read")
        self.inner.seek(self.start + target)
        self.position = target
        return target

    def digests(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.sha256 is not None:
            out["sha256"] = self.sha256.hexdigest()
        if self.crc32c is not None:
            out["crc32c"] = self.crc32c.digest().hex()  # type: ignore[no-untyped-call]
        if self.crc64nvme is not None:
            out["crc64nvme"] = f"{self.crc64nvme:016x}"
        return out

    # upload() implementations only read; these make it pass for a binary file object
    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.inner.close()


def known_checksums(entry: Entry) -> list[str]:
    return [name for name in MANIFEST_CHECKSUMS if name in entry]


def compute_digests(storage: Storage, key: str, algorithms: list[str]) -> dict[str, str]:
    """Read an object whole to digest it: the fallback when no provider checksum helps."""
    with storage.open_read(key) as raw:
        reader = DigestingReader(raw, algorithms)
        while reader.read(READ_CHUNK):
            pass
        return reader.digests()


def mismatch(
    storage: Storage,
    key: str,
    entry: Entry,
    *,
    streamed: Mapping[str, str] | None = None,
    source: ObjectInfo | None = None,
) -> str | None:
    """Why the object at `key` does not match its manifest entry; None when it does.

    Sizes always; checksums when the manifest knows them: the provider's own first (a
    full-object checksum of the manifest's algorithm: no read), then those digested while
    streaming, then a server-side copy's source fingerprints (a full-object checksum or MD5
    both objects of the one provider report; a multipart ETag is never one), and reading
    the object only as a last resort. A manifest without checksums still has a server-side
    copy compared with its source where both report one of those fingerprints.
    """
    info = storage.head(key)
    if info is None:
        return f"{key} is missing"
    if info.size_bytes != entry["size_bytes"]:
        return f"{key} has {info.size_bytes} bytes, the manifest says {entry['size_bytes']}"
    wanted = known_checksums(entry)
    checked = False
    for name in wanted:
        for found in (info.checksums.get(name), (streamed or {}).get(name)):
            if found is not None:
                if found != entry[name]:
                    return f"{key} has {name} {found}, the manifest says {entry[name]}"
                checked = True
    if checked:
        return None
    if source is not None:
        common = [n for n in ("crc64nvme", "crc32c", "sha256", "md5") if n in source.checksums]
        common = [n for n in common if n in info.checksums]
        if common:
            name = common[0]
            if source.checksums[name] != info.checksums[name]:
                return f"{key} has {name} {info.checksums[name]}, its source has another"
            return None
    if not wanted:
        return None
    computed = compute_digests(storage, key, wanted)
    for name in wanted:
        if computed[name] != entry[name]:
            return f"{key} has {name} {computed[name]}, the manifest says {entry[name]}"
    return None


def copy_files(
    source: Storage,
    source_prefix: str,
    dest: Storage,
    dest_prefix: str,
    manifest: Sequence[Entry],
    *,
    storage_class: str | None,
    concurrency: int = 4,
    on_file: Callable[[], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> TransferReport:
    """Copy every manifest file not already at the destination; raises VerificationFailed
    when streamed bytes disagree with the manifest. Files copy in parallel; memory stays
    bounded because each file streams part by part. `on_bytes` hears of the bytes done as
    they stream (a server-side copy or a file already there: once, whole)."""
    done = on_bytes or (lambda _n: None)
    report = TransferReport()
    server_side = dest.same_service(source)

    def one(entry: Entry) -> None:
        path, size = entry["path"], int(entry["size_bytes"])
        source_key, dest_key = join_key(source_prefix, path), join_key(dest_prefix, path)
        source_info = source.head(source_key) if server_side else None
        present = dest.head(dest_key)
        if (
            present is not None
            and present.size_bytes == size
            and mismatch(dest, dest_key, entry, source=source_info) is None
        ):
            report.add(skipped=True)
            done(size)
            return
        if server_side:
            dest.copy_within(source, source_key, dest_key, size, storage_class=storage_class)
            report.add(server_side=size)
            done(size)
            metrics.bytes_transferred("server_side", source.scheme, dest.scheme, size)
        else:
            with source.open_read(source_key) as raw:
                reader = DigestingReader(raw, known_checksums(entry), size, progress=done)
                dest.upload(dest_key, reader, size, storage_class=storage_class)  # type: ignore[arg-type]
            digests = reader.digests()
            for name, value in digests.items():
                if value != entry[name]:
                    raise VerificationFailed(
                        f"{source_key} read with {name} {value}, the manifest says {entry[name]}"
                    )
            with report._lock:
                report.digests[path] = digests
            report.add(streamed=reader.count)
            metrics.bytes_transferred("streamed", source.scheme, dest.scheme, reader.count)
        if on_file is not None:
            on_file()

    run_parallel(one, manifest, concurrency)
    return report


def change_class(
    storage: Storage,
    prefix: str,
    manifest: Sequence[Entry],
    storage_class: str,
    concurrency: int = 8,
) -> TransferReport:
    """A class change in place: server-side, the bytes stay where they are."""
    report = TransferReport()

    def one(entry: Entry) -> None:
        storage.set_storage_class(join_key(prefix, entry["path"]), storage_class)
        report.add(server_side=int(entry["size_bytes"]))
        metrics.bytes_transferred(
            "class_change", storage.scheme, storage.scheme, int(entry["size_bytes"])
        )

    run_parallel(one, manifest, concurrency)
    return report


def verify_files(
    dest: Storage,
    dest_prefix: str,
    manifest: Sequence[Entry],
    *,
    streamed: Mapping[str, Mapping[str, str]] | None = None,
    source: Storage | None = None,
    source_prefix: str | None = None,
    concurrency: int = 8,
) -> list[str]:
    """Every file's mismatch (empty: verified). `source` lends provider fingerprints when it
    is the same service as `dest`."""
    problems: list[str] = []
    lock = threading.Lock()
    same = source is not None and source_prefix is not None and dest.same_service(source)

    def one(entry: Entry) -> None:
        path = entry["path"]
        source_info = (
            source.head(join_key(source_prefix, path))
            if same and source is not None and source_prefix is not None
            else None
        )
        problem = mismatch(
            dest,
            join_key(dest_prefix, path),
            entry,
            streamed=(streamed or {}).get(path),
            source=source_info,
        )
        if problem is not None:
            with lock:
                problems.append(problem)

    run_parallel(one, manifest, concurrency)
    return sorted(problems)


def run_parallel(work: Callable[[Entry], None], entries: Sequence[Entry], workers: int) -> None:
    """`work` on every entry, in up to `workers` threads that share the caller's context
    (its retry tally)."""
    if len(entries) <= 1 or workers <= 1:
        for entry in entries:
            work(entry)
        return
    carried = in_this_context(work)
    with ThreadPoolExecutor(max_workers=min(workers, len(entries))) as pool:
        for future in [pool.submit(carried, entry) for entry in entries]:
            future.result()
