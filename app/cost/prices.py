"""What a tier costs: built-in list prices per provider and storage class, merged with the
figures the tiers file sets on the tier (those always win).

The catalog is `prices.yaml`, shipped in this package; every figure names its source page
and the date it was checked. Pure code apart from reading that file once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.domain.tier import Tier

GB = 10**9  # 1 GB = 10^9 bytes (section 7b)
MONTH_DAYS = 30  # a month of storage is 30 days

FIGURES = (
    "storage_gb_month",
    "retrieval_gb",
    "egress_gb",
    "min_storage_days",
    "min_object_bytes",
    "write_requests_per_1000",
    "read_requests_per_1000",
)
WHOLE_FIGURES = frozenset({"min_storage_days", "min_object_bytes"})

# S3-compatible endpoints by host name; any other endpoint is an unknown provider.
ENDPOINT_PROVIDERS = (
    ("amazonaws.com", "aws"),
    ("backblazeb2.com", "backblaze-b2"),
    ("wasabisys.com", "wasabi"),
    ("r2.cloudflarestorage.com", "cloudflare-r2"),
    ("storage.googleapis.com", "gcs"),
)
DEFAULT_CLASS = {
    "aws": "STANDARD",
    "gcs": "STANDARD",
    "azure": "HOT",
    "backblaze-b2": "STANDARD",
    "wasabi": "STANDARD",
    "cloudflare-r2": "STANDARD",
}
UNKNOWN_PROVIDER = "s3-compatible"
LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Source:
    """Where a catalog figure comes from, what it covers, and when it was checked."""

    url: str
    covers: str
    as_of: str  # ISO date


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    key: str  # "<provider>/<STORAGE CLASS>"
    name: str
    figures: Mapping[str, float]
    sources: Mapping[str, Source]  # figure -> its source
    note: str | None = None


@dataclass(frozen=True, slots=True)
class PriceQuote:
    """Every price of one tier, wherever each figure came from."""

    storage_gb_month: float = 0.0
    retrieval_gb: float = 0.0
    egress_gb: float = 0.0
    min_storage_days: int = 0
    min_object_bytes: int = 0
    write_requests_per_1000: float = 0.0
    read_requests_per_1000: float = 0.0
    provider: str = LOCAL
    network: str = LOCAL  # moves between two networks pay egress at the source
    catalog: str | None = None  # the catalog entry that supplied the defaults
    given: frozenset[str] = frozenset()  # figures set on the tier itself
    sources: Mapping[str, Source] = field(default_factory=lambda: MappingProxyType({}))
    note: str | None = None

    def billable_bytes(self, size_bytes: float, objects: int = 1) -> float:
        """Bytes billed for `objects` objects of `size_bytes` in all (small ones round up)."""
        return max(float(size_bytes), float(objects * self.min_object_bytes))

    def usd_month(self, size_bytes: float) -> float:
        """Storage per month of `size_bytes` (never rounded)."""
        return size_bytes / GB * self.storage_gb_month


# --- the catalog file --------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _SourceDoc(_Strict):
    url: Annotated[str, Field(pattern=r"^https://")]
    covers: str
    as_of: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$")]


class _EntryDoc(_Strict):
    name: str
    note: str | None = None
    storage_gb_month: NonNegative
    retrieval_gb: NonNegative
    egress_gb: NonNegative
    min_storage_days: Annotated[int, Field(ge=0)]
    min_object_bytes: Annotated[int, Field(ge=0)]
    write_requests_per_1000: NonNegative
    read_requests_per_1000: NonNegative
    source: str
    figure_sources: dict[str, str] = {}


class _CatalogDoc(_Strict):
    sources: dict[str, _SourceDoc]
    entries: dict[Annotated[str, Field(pattern=r"^[a-z0-9-]+/[A-Z0-9_]+$")], _EntryDoc]

    @model_validator(mode="after")
    def _sources_exist(self) -> _CatalogDoc:
        for key, entry in self.entries.items():
            for figure, source in {"*": entry.source, **entry.figure_sources}.items():
                if figure != "*" and figure not in FIGURES:
                    raise ValueError(f"{key}: figure_sources names no figure {figure!r}")
                if source not in self.sources:
                    raise ValueError(f"{key}: unknown source {source!r}")
        return self


def parse_catalog(text: str) -> dict[str, CatalogEntry]:
    """Validate a catalog document; raises pydantic's ValidationError naming the field."""
    doc = _CatalogDoc.model_validate(yaml.safe_load(text))
    sources = {name: Source(s.url, s.covers, s.as_of) for name, s in doc.sources.items()}
    out: dict[str, CatalogEntry] = {}
    for key, entry in doc.entries.items():
        figures = {name: getattr(entry, name) for name in FIGURES}
        by_figure = {
            name: sources[entry.figure_sources.get(name, entry.source)] for name in FIGURES
        }
        out[key] = CatalogEntry(
            key=key,
            name=entry.name,
            figures=MappingProxyType(figures),
            sources=MappingProxyType(by_figure),
            note=entry.note,
        )
    return out


@cache
def catalog() -> Mapping[str, CatalogEntry]:
    """The built-in catalog, read once."""
    text = resources.files("app.cost").joinpath("prices.yaml").read_text(encoding="utf-8")
    return MappingProxyType(parse_catalog(text))


def known_entry(name: str) -> str | None:
    """The catalog key `name` spells, whatever its case (`aws/glacier_ir` is
    `aws/GLACIER_IR`); None when the catalog has no such entry."""
    provider, sep, klass = name.strip().partition("/")
    key = f"{provider.lower()}/{klass.upper()}"
    return key if sep and key in catalog() else None


def unknown_entry_message(name: str) -> str:
    return f"no built-in price catalog entry {name!r}; known entries: " + ", ".join(
        sorted(catalog())
    )


# --- which entry a tier gets ---------------------------------------------------------------


def provider_of(tier: Tier) -> str:
    """`local`, `aws`, `gcs`, a known S3-compatible provider named by the tier's endpoint
    host, or `s3-compatible` for any other endpoint."""
    scheme = tier.url.split(":", 1)[0].lower()
    if scheme == "file":
        return LOCAL
    if scheme == "gs":
        return "gcs"
    if not tier.endpoint_url:
        return "aws"
    host = (urlsplit(tier.endpoint_url).hostname or "").lower()
    for suffix, provider in ENDPOINT_PROVIDERS:
        if host == suffix or host.endswith("." + suffix):
            return provider
    return UNKNOWN_PROVIDER


def _network(tier: Tier, provider: str) -> str:
    if provider == UNKNOWN_PROVIDER:
        return f"{provider}:{(urlsplit(tier.endpoint_url or '').hostname or '').lower()}"
    return provider


def _given(tier: Tier) -> dict[str, Any]:
    """Figures the tier's own `price` sets: those that are not None. Read by name, so a
    tiers file that cannot tell a figure left out from a 0 makes every figure given."""
    out = {}
    for name in FIGURES:
        value = getattr(tier.price, name, None)
        if value is not None:
            out[name] = int(value) if name in WHOLE_FIGURES else float(value)
    return out


def catalog_key(tier: Tier) -> str | None:
    """The catalog entry for a tier: the one its price names (`catalog`), else its provider
    and storage class (the provider's default class when none is set); None for a local
    tier or an unknown S3-compatible provider."""
    named = getattr(tier.price, "catalog", None)
    if isinstance(named, str) and named:
        return named
    provider = provider_of(tier)
    default = DEFAULT_CLASS.get(provider)
    if default is None:
        return None
    return f"{provider}/{(tier.storage_class or default).upper()}"


@lru_cache(maxsize=1024)
def effective_price(tier: Tier) -> PriceQuote:
    """The tier's prices: catalog defaults for its provider and storage class, each figure
    the tier's own `price` sets overriding them. A local tier or an unknown provider has no
    defaults (0 unless priced); the quote's `note` says so."""
    given = _given(tier)
    key = catalog_key(tier)
    entry = catalog().get(key) if key is not None else None
    named = getattr(tier.price, "catalog", None)
    provider = key.split("/", 1)[0] if named and key else provider_of(tier)
    figures: dict[str, Any] = dict.fromkeys(FIGURES, 0)
    sources: dict[str, Source] = {}
    note: str | None
    if entry is not None:
        figures.update(entry.figures)
        sources.update(entry.sources)
        note = entry.note
    elif provider == LOCAL:
        note = "local tier: priced by the operator (0 unless set in the tiers file)"
    elif key is None:
        note = "unknown S3-compatible provider: set its price in the tiers file"
    else:
        note = f"no built-in price for {key}: set its price in the tiers file"
    figures.update(given)
    for name in given:
        sources.pop(name, None)
    return PriceQuote(
        **figures,
        provider=provider,
        network=provider if named else _network(tier, provider),
        catalog=entry.key if entry is not None else None,
        given=frozenset(given),
        sources=MappingProxyType(sources),
        note=note,
    )


def with_figures(quote: PriceQuote, figures: Mapping[str, float | int]) -> PriceQuote:
    """`quote` with some figures replaced (a what-if); they count as given."""
    unknown = set(figures) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown price figures: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {
        k: int(v) if k in WHOLE_FIGURES else float(v) for k, v in figures.items()
    }
    sources = {k: v for k, v in quote.sources.items() if k not in values}
    return replace(
        quote,
        **values,
        given=quote.given | frozenset(values),
        sources=MappingProxyType(sources),
    )


def catalog_quote(key: str) -> PriceQuote:
    """The defaults of catalog entry `key` as a quote of their own (a what-if describes a
    tier's price anew); raises KeyError for an unknown key."""
    entry = catalog()[key]
    provider = key.split("/", 1)[0]
    figures: dict[str, Any] = dict(entry.figures)
    return PriceQuote(
        **figures,
        provider=provider,
        network=provider,
        catalog=key,
        sources=entry.sources,
        note=entry.note,
    )
