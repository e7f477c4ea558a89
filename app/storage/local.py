"""Local/POSIX directory tiers."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from app.domain.tier import real_root
from app.storage.base import ObjectInfo, ObjectMissing, UnsafePath

CHUNK = 8 * 1024 * 1024


class LocalStorage:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(real_root(str(root)))

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == str(self.root) or real.startswith(str(self.root) + os.sep)

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
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
                found.append(ObjectInfo(key=rel, size_bytes=os.stat(full).st_size))
        found.sort(key=lambda info: info.key)
        return found

    def prefix_exists(self, prefix: str) -> bool:
        return self._path(prefix).is_dir()

    def delete_prefix(self, prefix: str) -> None:
        """Remove everything under `prefix`. Idempotent: a missing prefix is success."""
        target = self._path(prefix)
        if not prefix or target == self.root:
            raise UnsafePath("refusing to delete a tier's root")
        if target.is_symlink() or target.is_file():
            target.unlink(missing_ok=True)
        elif target.exists():
            shutil.rmtree(target)

    def file_size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def sha256(self, key: str) -> str:
        digest = hashlib.sha256()
        with open(self._path(key), "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def copy_in(
        self,
        source: LocalStorage,
        source_prefix: str,
        dest_prefix: str,
        paths: list[str],
        staging: str,
    ) -> None:
        """Copy `paths` from `source` into `dest_prefix`, through `staging` and one rename,
        so `dest_prefix` either does not exist or holds every file."""
        self.delete_prefix(staging)
        for rel in paths:
            target = self._path(f"{staging}/{rel}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source._path(f"{source_prefix}/{rel}"), target)
        self.delete_prefix(dest_prefix)
        self._path(dest_prefix).parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(staging), self._path(dest_prefix))
