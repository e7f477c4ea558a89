"""File manifests: building one from storage, and deciding whether two describe the same bytes."""

from __future__ import annotations

from typing import Any

from app.domain.errors import Invalid, Unavailable
from app.domain.tier import Located
from app.storage.base import MANIFEST_CHECKSUMS, ObjectMissing, StorageError, UnsafePath
from app.storage.registry import storage_for

Manifest = list[dict[str, Any]]


def normalise(files: list[dict[str, Any]]) -> Manifest:
    """Sorted by path, checksums left out when unknown; duplicate paths are refused."""
    out: Manifest = []
    seen: set[str] = set()
    for entry in files:
        path = entry["path"]
        if path in seen:
            raise Invalid(f"path {path!r} appears twice in the manifest", field="files")
        seen.add(path)
        out.append(
            entry
            if None not in entry.values()
            else {k: v for k, v in entry.items() if v is not None}
        )
    out.sort(key=lambda e: e["path"])
    return out


def list_manifest(located: Located) -> Manifest:
    """List a checkpoint's files where it lives; refuses a missing or empty location."""
    storage = storage_for(located.tier)
    try:
        infos = storage.list_prefix(located.key)
    except ObjectMissing:
        raise Invalid(f"{located.uri!r} does not exist", field="uri") from None
    except UnsafePath as error:
        raise Invalid(f"{located.uri!r}: {error}", field="uri") from None
    except StorageError as error:
        raise Unavailable(f"could not list {located.uri!r}: {error}", field="uri") from None
    if not infos:
        raise Invalid(f"{located.uri!r} holds no files", field="uri")
    return [
        {
            "path": info.key,
            "size_bytes": info.size_bytes,
            **{n: info.checksums[n] for n in MANIFEST_CHECKSUMS if n in info.checksums},
        }
        for info in infos
    ]


def require_exists(located: Located) -> None:
    """A committed checkpoint on a local tier must be there when registered."""
    if located.tier.is_local and not storage_for(located.tier).prefix_exists(located.key):
        raise Invalid(f"{located.uri!r} does not exist", field="uri")


def total_size(files: Manifest | None, size_bytes: int | None) -> int:
    if files is None:
        return size_bytes or 0
    total = sum(int(e["size_bytes"]) for e in files)
    if size_bytes is not None and size_bytes != total:
        raise Invalid(
            f"size_bytes {size_bytes} differs from the manifest's total {total}", field="size_bytes"
        )
    return total


def same_files(a: Manifest | None, b: Manifest | None) -> bool:
    """Same paths and sizes; a checksum conflicts only when both sides know it."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    for left, right in zip(a, b, strict=True):
        if left["path"] != right["path"] or left["size_bytes"] != right["size_bytes"]:
            return False
        for checksum in ("sha256", "crc32c"):
            if checksum in left and checksum in right and left[checksum] != right[checksum]:
                return False
    return True
