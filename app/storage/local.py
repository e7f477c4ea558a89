"""Local/POSIX directory tiers."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from app.domain.tier import real_root
from app.storage.base import (
    NO_CHECKSUMS,
    ObjectInfo,
    ObjectMissing,
    PermanentError,
    RestoreState,
    Storage,
    StorageError,
    UnsafePath,
    read_whole,
)

CHUNK = 8 * 1024 * 1024


def _opened_path(fd: int, path: str) -> str:
    """The real path of the file open at `fd` (Linux names it under /proc); elsewhere the
    real path of `path`, resolved after the open."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def _sorted_entries(directory: str) -> list[tuple[str, os.DirEntry[str]]]:
    """A directory's entries in key order, each subdirectory named with a trailing `/`."""
    with os.scandir(directory) as found:
        return sorted(
            (entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name, entry)
            for entry in found
        )


def _read_fd(fd: int, limit: int, what: str) -> bytes:
    """At most `limit` bytes of an open file, to its end; refused beyond (it grew since
    it was sized)."""
    pieces: list[bytes] = []
    read = 0
    while piece := os.read(fd, min(CHUNK, limit + 1 - read)):
        pieces.append(piece)
        read += len(piece)
        if read > limit:
            raise PermanentError(f"{what}: more than the {limit} bytes read whole")
    return b"".join(pieces)


def _same_file(reader: BinaryIO, checked: os.stat_result, key: str) -> BinaryIO:
    """`reader`, opened again after `checked` passed the checks, if it is that file."""
    now = os.fstat(reader.fileno())
    if (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
        reader.close()
        raise UnsafePath(f"{key!r} changed while it was opened")
    return reader


class LocalStorage:
    scheme = "file"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(real_root(str(root)))

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _inside(self, path: str) -> bool:
        return self._within(os.path.realpath(path))

    def _within(self, real: str) -> bool:
        """Whether a resolved path is the tier's root or lies under it."""
        return real == str(self.root) or real.startswith(str(self.root) + os.sep)

    def same_service(self, other: Storage) -> bool:
        """Directories have no server to copy for us: bytes always stream (and get digested)."""
        return False

    # -- reading ---------------------------------------------------------------------------

    def list_prefix(self, prefix: str, *, checksums: bool = False) -> list[ObjectInfo]:
        """A file system keeps no checksums: `checksums` finds none (reading every byte to
        digest it is the job's, who wrote them, or a deep reconciliation's)."""
        base = self._path(prefix)
        if not base.is_dir():
            raise ObjectMissing(f"{prefix!r} is not a directory on this tier")
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            for name in dirnames:
                if os.path.islink(os.path.join(dirpath, name)):
                    raise UnsafePath(f"directory symlink {name!r} inside {prefix!r}")
            for name in filenames:
                full = os.path.join(dirpath, name)
                if not self._inside(full):
                    raise UnsafePath(f"{os.path.relpath(full, base)!r} leads outside the tier")
                rel = os.path.relpath(full, base).replace(os.sep, "/")
                status = os.stat(full)
                modified = datetime.fromtimestamp(status.st_mtime, UTC)
                found.append(ObjectInfo(key=rel, size_bytes=status.st_size, modified=modified))
        found.sort(key=lambda info: info.key)
        return found

    def iter_prefix(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        # the walk itself, not a generator that hands on each of its objects
        base = self._path(prefix)
        return self._walk(str(base), "", start_after) if base.is_dir() else iter(())

    def _walk(self, directory: str, relative: str, start_after: str | None) -> Iterator[ObjectInfo]:
        """Every file under `directory` in key order: a subdirectory sorts as its name and
        a `/`, so `a.txt` comes before `a/x` as it does in a bucket's listing. A
        subdirectory is skipped whole when every key under it lies at or before
        `start_after`. Depth first with a stack of its own rather than a generator per
        directory: through nested generators each object of a tree six levels deep was
        handed up six times (a third of an import's walk, at a million objects)."""
        utc, info, new = UTC, ObjectInfo, tuple.__new__
        fromtimestamp = datetime.fromtimestamp
        frames = [(iter(_sorted_entries(directory)), relative, start_after)]
        while frames:
            entries, relative, after = frames[-1]
            for name, entry in entries:
                key = relative + name
                if name[-1] == "/":  # a subdirectory
                    within = after is not None and after.startswith(key)
                    if after is not None and key <= after and not within:
                        continue
                    below = _sorted_entries(entry.path)
                    frames.append((iter(below), key, after if within else None))
                    break  # into it; this directory's iterator goes on once it is done
                if after is not None and key <= after:
                    continue
                if entry.is_symlink():
                    if os.path.isdir(entry.path):
                        raise UnsafePath(f"directory symlink {key!r} under this tier")
                    if not self._inside(entry.path):
                        raise UnsafePath(f"{key!r} leads outside the tier")
                status = entry.stat()
                # ObjectInfo's fields in order, without its Python-level constructor (a
                # million files): key, size_bytes, storage_class, checksums, modified
                modified = fromtimestamp(status.st_mtime, utc)
                yield new(info, (key, status.st_size, None, NO_CHECKSUMS, modified))
            else:
                frames.pop()

    def prefix_exists(self, prefix: str) -> bool:
        return self._path(prefix).is_dir()

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file() or not self._inside(str(path)):
            return None
        return ObjectInfo(key=key, size_bytes=path.stat().st_size)

    def open_read(self, key: str) -> BinaryIO:
        """Opened first, then asked where it is: the kernel names the file the descriptor
        holds in one call, where `realpath` costs an lstat per component (an import reads
        a Trainer's state file in every one of thousands of checkpoints), and nothing can
        swap a symlink in between the check and the open. Opened without blocking, so
        that a symlink to a named pipe outside the tier is refused rather than waited on;
        a pipe inside the tier reads as a pipe does, opened again once checked."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ObjectMissing(f"{key!r} does not exist") from None
        try:
            found = os.fstat(fd)
            if stat.S_ISDIR(found.st_mode):
                raise IsADirectoryError(f"{key!r} is a directory")
            if not self._within(_opened_path(fd, str(path))):
                raise UnsafePath(f"{key!r} leads outside the tier")
            if not stat.S_ISFIFO(found.st_mode):
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
            # A pipe inside the tier: opened again, waiting for its writer, before the first
            # descriptor closes (a writer that came in between would find no reader left).
            reader = open(path, "rb")  # noqa: SIM115 (the caller closes it)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return _same_file(reader, found, key)

    def read_small(self, key: str, limit: int) -> bytes:
        """Sized first: reading `limit` + 1 bytes of a small file would have Python set
        aside the whole `limit` (an import's 64 MiB) for each of thousands of reads. A
        regular file is read from the descriptor its checks were made on, with no file
        object around it: an import reads a Trainer's state file in each of thousands of
        checkpoints, and the object, its buffer and the path's parsing were half the
        cost of each read. Anything else (a pipe) is read as `open_read` opens it."""
        path = os.path.join(self.root, key) if key else str(self.root)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ObjectMissing(f"{key!r} does not exist") from None
        try:
            found = os.fstat(fd)
            if stat.S_ISREG(found.st_mode):
                if not self._within(_opened_path(fd, path)):
                    raise UnsafePath(f"{key!r} leads outside the tier")
                if found.st_size > limit:
                    raise PermanentError(f"{key!r}: more than the {limit} bytes read whole")
                return _read_fd(fd, limit, f"{key!r}")
        finally:
            os.close(fd)
        with self.open_read(key) as reader:
            size = os.fstat(reader.fileno()).st_size
            if size > limit:
                raise PermanentError(f"{key!r}: more than the {limit} bytes read whole")
            return read_whole(reader, size, f"{key!r}")

    # -- writing ---------------------------------------------------------------------------

    def upload(
        self, key: str, reader: BinaryIO, size: int, *, storage_class: str | None = None
    ) -> None:
        """Through a temporary name and one rename: the key holds all of it or nothing."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex}")
        written = 0
        try:
            with open(partial, "wb") as out:
                while written < size and (chunk := reader.read(min(CHUNK, size - written))):
                    out.write(chunk)
                    written += len(chunk)
            if written != size:
                raise StorageError(f"{key!r}: source ended after {written} of {size} bytes")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def copy_within(
        self,
        source: Storage,
        source_key: str,
        key: str,
        size: int,
        *,
        storage_class: str | None = None,
    ) -> None:
        if not isinstance(source, LocalStorage):
            raise StorageError("copy_within needs a local source")
        with source.open_read(source_key) as reader:
            self.upload(key, reader, size)

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Directories have no storage classes."""

    def delete_keys(self, keys: Iterable[str]) -> int:
        count = 0
        for key in keys:
            if not key:
                raise UnsafePath("refusing to delete a tier's root")
            self._path(key).unlink(missing_ok=True)
            count += 1
        return count

    def delete_prefix(self, prefix: str) -> int:
        """Remove everything under `prefix`. Idempotent: a missing prefix is success."""
        target = self._path(prefix)
        if not prefix or target == self.root:
            raise UnsafePath("refusing to delete a tier's root")
        if target.is_symlink() or target.is_file():
            target.unlink(missing_ok=True)
            return 1
        if not target.exists():
            return 0
        count = sum(len(files) for _, _, files in os.walk(target))
        shutil.rmtree(target)
        return count

    def abort_uploads(self, prefix: str) -> int:
        """A crashed upload leaves `.name.partial-*` files; remove them."""
        base = self._path(prefix)
        count = 0
        if base.is_dir():
            for partial in base.rglob(".*.partial-*"):
                partial.unlink(missing_ok=True)
                count += 1
        return count

    # -- archive classes -------------------------------------------------------------------

    def restore_state(self, key: str) -> RestoreState:
        return "readable"

    def request_restore(self, key: str, *, days: int = 1) -> None:
        """Nothing is ever archived on a directory."""
