"""File manifests: building one from storage, and deciding whether two describe the same bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.domain.errors import Invalid, Unavailable
from app.domain.tier import Located, symlink_leaving_tier
from app.storage.base import (
    MANIFEST_CHECKSUMS,
    ObjectMissing,
    StorageError,
    UnsafePath,
    file_entry,
)
from app.storage.registry import StorageRegistry

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


@dataclass(frozen=True, slots=True)
class Listed:
    files: Manifest
    single_file: bool  # the uri names one object, not a prefix


def list_manifest(located: Located, storages: StorageRegistry) -> Listed:
    """List a checkpoint's files where it lives: every object under the uri's prefix, or
    the one object the uri names (a single-file checkpoint). Refuses a missing or empty
    location. Each file's full-object checksums the provider keeps (GCS's crc32c, S3's
    CRC64NVME, or a full-object CRC32C or SHA-256) are recorded with its size, so that
    copies are verified against them without reading anything back."""
    storage = storages.storage_for(located.tier)
    try:
        try:
            infos = storage.list_prefix(located.key, checksums=True)
        except ObjectMissing:
            single = storage.head(located.key)
            if single is None:
                raise
            return Listed([file_entry(basename(located.key), single)], single_file=True)
    except ObjectMissing:
        raise Invalid(f"{located.uri!r} does not exist", field="uri") from None
    except UnsafePath as error:
        raise Invalid(f"{located.uri!r}: {error}", field="uri") from None
    except StorageError as error:
        raise Unavailable(f"could not list {located.uri!r}: {error}", field="uri") from None
    if not infos:
        raise Invalid(f"{located.uri!r} holds no files", field="uri")
    return Listed([file_entry(info.key, info) for info in infos], single_file=False)


def basename(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _names_itself(located: Located, files: Manifest) -> bool:
    return len(files) == 1 and files[0]["path"] == basename(located.key)


def check_supplied(located: Located, files: Manifest, storages: StorageRegistry) -> bool:
    """Check a manifest a job sent for a committed checkpoint; returns whether the uri
    names one object (its manifest then is that one file, by its base name).

    On a local tier the uri must exist, and no file may lead outside the tier through a
    symlink (the same rule a listing applies). On object stores nothing is read: a
    manifest of one file named like the uri's last segment is a single-file checkpoint."""
    if not located.tier.is_local:
        return _names_itself(located, files)
    storage = storages.storage_for(located.tier)
    single = not storage.prefix_exists(located.key)
    if single and storage.head(located.key) is None:
        raise Invalid(f"{located.uri!r} does not exist", field="uri")
    if single and not _names_itself(located, files):
        raise Invalid(
            f"{located.uri!r} is one file: its manifest must be that file alone, "
            f"with path {basename(located.key)!r}",
            field="files",
        )
    if single:
        return True  # `locate` has followed every component of the uri, the file included
    paths = [str(e["path"]) for e in files]
    leaving = symlink_leaving_tier(located.tier.parsed.path, located.key, paths)
    if leaving is not None:
        raise Invalid(
            f"{leaving!r} of {located.uri!r} leads outside tier {located.tier.name!r} "
            "through a symlink",
            field="files",
        )
    return single


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
        for checksum in MANIFEST_CHECKSUMS:
            if checksum in left and checksum in right and left[checksum] != right[checksum]:
                return False
    return True
