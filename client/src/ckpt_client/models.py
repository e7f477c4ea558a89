"""The catalog's records as plain, immutable Python values.

Built from the service's JSON with every key read by name, so a newer service that adds
fields never breaks an older client. Code that must run on Python 3.10: no `datetime.UTC`,
and `fromisoformat` there reads neither `Z` nor anything but 3 or 6 fraction digits.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import unquote, urlsplit

# ISO 8601 as the service writes it: a fraction of any length, `Z` or an offset.
_TIMESTAMP = re.compile(
    r"(?P<base>\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?P<zone>[Zz]|[+-]\d{2}:?\d{2})?"
)


def parse_time(value: str) -> datetime:
    """An aware UTC datetime from the service's timestamp (no offset means UTC)."""
    match = _TIMESTAMP.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}")
    fraction = (match["fraction"] or "").ljust(6, "0")[:6]
    zone = match["zone"] or "+00:00"
    if zone in ("Z", "z"):
        zone = "+00:00"
    elif ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    text = match["base"].replace("t", "T").replace(" ", "T") + (f".{fraction}" if fraction else "")
    return datetime.fromisoformat(text + zone).astimezone(timezone.utc)


def format_time(moment: datetime) -> str:
    """ISO 8601 UTC with `Z`, as the API takes it; a naive datetime is taken as UTC (as the
    service itself does) rather than as local time."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _optional_time(value: Any) -> datetime | None:
    return parse_time(value) if isinstance(value, str) else None


def to_uri(location: str | os.PathLike[str]) -> str:
    """A uri for the catalog: strings pass as they are; a local path becomes `file://` of
    its absolute form. Only `%`, `?` and `#` are escaped (the service reads the path
    percent-decoded, and those three would otherwise end or change it): the service writes
    its own file uris unescaped, and the two must compare equal."""
    if isinstance(location, str):
        return location
    path = os.path.abspath(os.fspath(location))
    escaped = path.replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    return f"file://{escaped}"


def local_path_of(uri: str) -> Path | None:
    """The local path a `file://` uri names, else None."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parts.path))


class _FileRequired(TypedDict):
    path: str
    size_bytes: int


class FileEntry(_FileRequired, total=False):
    """One file of a manifest: its path relative to the checkpoint's uri, its size, and
    optionally a checksum the service verifies copies against."""

    sha256: str
    crc32c: str
    crc64nvme: str  # S3's full-object CRC64NVME, as a registration by listing records it


@dataclass(frozen=True)
class Location:
    """Where one copy of a checkpoint lives: its primary or a replica on another tier."""

    tier: str
    uri: str
    role: str
    storage_class: str | None = None

    @property
    def local_path(self) -> Path | None:
        """A `pathlib.Path` when this copy is on a local (`file://`) tier, else None."""
        return local_path_of(self.uri)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Location:
        return cls(
            tier=str(data["tier"]),
            uri=str(data["uri"]),
            role=str(data.get("role", "primary")),
            storage_class=data.get("storage_class"),
        )


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as the catalog holds it. `cls` is the checkpoint class (`class` in the
    API: a keyword in Python); `uri` and `tier` are the primary location's."""

    id: str
    run_id: str
    step: int
    cls: str
    state: str
    tier: str | None
    uri: str
    locations: tuple[Location, ...]
    metrics: dict[str, float]
    pinned: bool
    size_bytes: int
    labels: dict[str, str] = field(default_factory=dict)
    files: tuple[dict[str, Any], ...] | None = None
    pin_reason: str | None = None
    created_at: datetime | None = None
    reserved_until: datetime | None = None  # while `writing`: when the reservation lapses

    def __hash__(self) -> int:  # the dict fields would make the generated hash raise
        return hash(self.id)

    @property
    def local_path(self) -> Path | None:
        """A `pathlib.Path` for a `file://` primary location, else None."""
        return local_path_of(self.uri)

    def location(self, tier: str) -> Location | None:
        """This checkpoint's copy on `tier` (primary or replica), if it has one."""
        return next((loc for loc in self.locations if loc.tier == tier), None)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        files = data.get("files")
        return cls(
            id=str(data["id"]),
            run_id=str(data["run_id"]),
            step=int(data["step"]),
            cls=str(data["class"]),
            state=str(data["state"]),
            tier=data.get("tier"),
            uri=str(data["uri"]),
            locations=tuple(Location.from_json(loc) for loc in data.get("locations") or ()),
            metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()},
            pinned=bool(data.get("pinned", False)),
            size_bytes=int(data.get("size_bytes") or 0),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
            files=tuple(files) if isinstance(files, list) else None,
            pin_reason=data.get("pin_reason"),
            created_at=_optional_time(data.get("created_at")),
            reserved_until=_optional_time(data.get("reserved_until")),
        )


@dataclass(frozen=True)
class Tier:
    """A storage tier of the service, hottest first (`rank` 0). `url` is where the service
    keeps that tier's checkpoints: a job writes under it (`file://`, `s3://`, `gs://`)."""

    name: str
    url: str
    rank: int
    storage_class: str | None = None

    @property
    def local_path(self) -> Path | None:
        """The directory of a local (`file://`) tier, else None."""
        return local_path_of(self.url)

    def uri_for(self, project: str, run_name: str, step: int) -> str:
        """Where the service itself would place `step` of a run on this tier:
        `<url>/<project>/<run name>/step-<step>`, the layout moves keep."""
        return f"{self.url.rstrip('/')}/{project}/{run_name}/step-{step}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tier:
        return cls(
            name=str(data["name"]),
            url=str(data["url"]),
            rank=int(data.get("rank", 0)),
            storage_class=data.get("storage_class"),
        )


def scalars(metrics: Any) -> dict[str, float]:
    """The finite numbers among a framework's metrics (a flat mapping; tensors and arrays
    of one element included): what the catalog stores, so nothing NaN or infinite."""
    out: dict[str, float] = {}
    if not isinstance(metrics, Mapping):
        return out
    for name, value in metrics.items():
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            out[str(name)] = number
    return out


def directory_manifest(root: Path) -> list[FileEntry]:
    """Every file under the step directory `root`: its path relative to it and its size,
    as the framework left them (sent with the registration or commit, so the service need
    not list the directory)."""
    entries: list[FileEntry] = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            entries.append(
                {"path": path.relative_to(root).as_posix(), "size_bytes": path.stat().st_size}
            )
    return sorted(entries, key=lambda e: e["path"])
