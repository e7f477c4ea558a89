"""The storage vocabulary shared by every adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class StorageError(Exception):
    """A storage operation failed; `retryable` says whether trying again may help."""

    retryable = False


class ObjectMissing(StorageError):
    """The object or prefix does not exist."""


class UnsafePath(StorageError):
    """A path under a tier leads outside it (a symlink, say)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str  # relative to the listed prefix, '/' separated
    size_bytes: int


class Storage(Protocol):
    """One tier's objects, addressed by keys relative to the tier's url."""

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix`, sorted by key. Raises ObjectMissing when there is
        none, UnsafePath when one leads outside the tier. Read-only."""
        ...

    def prefix_exists(self, prefix: str) -> bool:
        """Whether anything lives under `prefix`. Read-only."""
        ...
