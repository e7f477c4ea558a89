"""Tiers and where a URI lives: pure code, no I/O except the symlink check in `locate`."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from app.domain.errors import Invalid
from app.domain.provider import ProviderSettings

SCHEMES = ("file", "s3", "gs")


@dataclass(frozen=True, slots=True)
class Price:
    """The figures a tiers file sets on a tier; None leaves the figure to the built-in
    catalog (app.cost.prices: the tier's provider and storage class, or the entry named by
    `catalog`), and to 0 where the catalog has none (local tiers, unknown providers).
    USD; storage per GB-month, retrieval and egress per GB, requests per 1,000."""

    storage_gb_month: float | None = None
    retrieval_gb: float | None = None
    egress_gb: float | None = None
    min_storage_days: int | None = None
    min_object_bytes: int | None = None
    write_requests_per_1000: float | None = None
    read_requests_per_1000: float | None = None
    catalog: str | None = None  # a catalog entry, "<provider>/<STORAGE CLASS>"


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """A storage URL split into scheme, container (bucket; empty for file) and path."""

    scheme: str
    bucket: str
    path: str  # file: absolute path without trailing slash; objects: key prefix, no slashes around

    def join(self, relative: str) -> str:
        relative = relative.strip("/")
        if self.scheme == "file":
            base = self.path.rstrip("/") or ""
            return f"file://{base}/{relative}" if relative else f"file://{self.path}"
        prefix = "/".join(p for p in (self.path, relative) if p)
        return (
            f"{self.scheme}://{self.bucket}/{prefix}"
            if prefix
            else f"{self.scheme}://{self.bucket}"
        )


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    url: str
    rank: int  # 0 = hottest
    storage_class: str | None = None
    endpoint_url: str | None = None
    request_checksums: str = "when_supported"
    price: Price = field(default_factory=Price)
    provider: ProviderSettings = field(default_factory=ProviderSettings)
    detect: bool = False  # read the bucket's settings at start (storage.bucket_settings)

    @property
    def parsed(self) -> ParsedUrl:
        return _parse_tier_url(self.url)

    @property
    def is_local(self) -> bool:
        return self.url.startswith("file://")


@dataclass(frozen=True, slots=True)
class Located:
    """A URI resolved to its tier: `key` is the path relative to the tier's url."""

    tier: Tier
    uri: str
    key: str


@lru_cache(maxsize=256)
def _parse_tier_url(url: str) -> ParsedUrl:
    return parse_url(url, field_name="url")


def parse_url(url: str, *, field_name: str) -> ParsedUrl:
    """Split and sanitise a storage URL; raises Invalid naming `field_name`."""
    if not isinstance(url, str) or not url:
        raise Invalid("must be a non-empty URI", field=field_name)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise Invalid(
            f"unsupported scheme {parts.scheme!r} in {url!r}: use file://, s3:// or gs://",
            field=field_name,
        )
    if parts.query or parts.fragment:
        raise Invalid(f"{url!r} must not carry a query or fragment", field=field_name)
    raw_path = unquote(parts.path)
    if "\x00" in raw_path:
        raise Invalid("must not contain NUL bytes", field=field_name)
    segments = [s for s in raw_path.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise Invalid(f"'..' is not allowed in {url!r}", field=field_name)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise Invalid(f"file URI {url!r} must name a local path", field=field_name)
        if not raw_path.startswith("/"):
            raise Invalid(f"file URI {url!r} must be absolute", field=field_name)
        return ParsedUrl("file", "", "/" + "/".join(segments))
    if not parts.netloc:
        raise Invalid(f"{url!r} names no bucket", field=field_name)
    return ParsedUrl(scheme, parts.netloc, "/".join(segments))


def _under(child: ParsedUrl, parent: ParsedUrl) -> str | None:
    """The key of `child` relative to `parent`, or None when it lies outside."""
    if child.scheme != parent.scheme or child.bucket != parent.bucket:
        return None
    if child.scheme == "file":
        base = parent.path.rstrip("/")
        if child.path == base or base == "":
            return child.path[len(base) :].strip("/")
        if child.path.startswith(base + "/"):
            return child.path[len(base) + 1 :]
        return None
    if not parent.path:
        return child.path
    if child.path == parent.path:
        return ""
    if child.path.startswith(parent.path + "/"):
        return child.path[len(parent.path) + 1 :]
    return None


def locate(uri: str, tiers: list[Tier], *, field_name: str = "uri") -> Located:
    """Resolve `uri` to the tier whose url is its longest prefix.

    Refuses (Invalid) unknown schemes, `..`, URIs under no tier, the tier root
    itself, and local paths whose symlinks lead outside the tier.
    """
    parsed = parse_url(uri, field_name=field_name)
    best: tuple[int, Tier, str] | None = None
    for tier in tiers:
        tier_url = tier.parsed
        key = _under(parsed, tier_url)
        if key is not None and (best is None or len(tier_url.path) > best[0]):
            best = (len(tier_url.path), tier, key)
    if best is None:
        raise Invalid(f"{uri!r} lies under no configured tier", field=field_name)
    _, tier, key = best
    if not key:
        raise Invalid(
            f"{uri!r} is the root of tier {tier.name!r}, not a checkpoint", field=field_name
        )
    if parsed.scheme == "file" and _leaves_by_symlink(tier.parsed.path, key):
        raise Invalid(
            f"{uri!r} leads outside tier {tier.name!r} through a symlink", field=field_name
        )
    return Located(tier=tier, uri=tier.parsed.join(key), key=key)


@lru_cache(maxsize=256)
def real_root(path: str) -> str:
    """A tier root's real path (tier roots do not move while the service runs)."""
    return os.path.realpath(path)


def symlink_leaving_tier(root: str, key: str, paths: list[str]) -> str | None:
    """The first of `paths` (relative to `key`, a directory under the tier `root`) whose
    components below `key` include a symlink leading outside the tier; None when none
    does. `key` itself is `locate`'s to check.

    Each directory is listed once (`os.scandir`, whose entries know a symlink without a
    stat), however many files it holds: an lstat per file released and took back the GIL
    64 times for a 64-file manifest, and under 32 concurrent registrations every taking
    back waited behind the other request threads."""
    base = real_root(root)
    inside = base.rstrip("/") + "/"
    start = f"{base}/{key}" if key else base
    if os.path.islink(start):
        start = os.path.realpath(start)
    listed: dict[str, dict[str, os.DirEntry[str]]] = {}
    for path in paths:
        current = start
        for part in path.split("/"):
            entries = listed.get(current)
            if entries is None:
                entries = listed[current] = _entries(current)
            entry = entries.get(part)
            if entry is None:
                break  # the rest does not exist (yet): nothing to follow
            following = f"{current}/{part}"
            if entry.is_symlink():
                following = os.path.realpath(following)
                if following != base and not following.startswith(inside):
                    return path
            current = following
    return None


def _entries(directory: str) -> dict[str, os.DirEntry[str]]:
    """A directory's entries by name; none when it is not a directory (or is gone)."""
    try:
        with os.scandir(directory) as found:
            return {entry.name: entry for entry in found}
    except OSError:
        return {}


def _leaves_by_symlink(root: str, key: str) -> bool:
    """Whether a symlink among the components of `key` below `root` leads outside the
    tier. Only the components below the root are looked at, one lstat each, which is
    what makes this cheap enough for every registration."""
    base = real_root(root)
    current = base
    for part in key.split("/"):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            return False  # the rest does not exist yet: nothing to follow
        if stat.S_ISLNK(mode):
            current = os.path.realpath(current)
            if current != base and not current.startswith(base.rstrip("/") + "/"):
                return True
    return False
