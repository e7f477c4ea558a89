"""Local/POSIX directory tiers."""

from __future__ import annotations

import os
from pathlib import Path

from app.storage.base import ObjectInfo, ObjectMissing, UnsafePath


class LocalStorage:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.realpath(root))

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
