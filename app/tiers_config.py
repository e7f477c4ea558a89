"""The tier list: the four default local tiers, or a validated tiers YAML file."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.cost.prices import known_entry, unknown_entry_message
from app.domain.duration import parse_duration
from app.domain.errors import Invalid
from app.domain.provider import ObjectLock, ProviderSettings, autoclass_refusal
from app.domain.tier import Price, Tier, parse_url
from app.settings import Settings

DEFAULT_TIER_NAMES = ("hot", "warm", "cold", "archive")
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class TiersFileError(Exception):
    """The tiers file is unreadable or invalid; the message names the file and field."""


def _refuse_credentials(value: str) -> None:
    """Credentials come from the provider's own chain, never from a URL in the tiers file,
    which the API shows and logs may print. The message does not repeat the value."""
    if "@" in urlsplit(value).netloc:
        raise ValueError(
            "must not hold credentials (user:password@host): the provider's own chain "
            "(environment, profile, workload identity) supplies them"
        )


Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]


class PriceConfig(BaseModel):
    """A tier's own prices. A figure left out comes from the built-in catalog (the tier's
    provider and storage class, or the entry `catalog` names), else 0; a figure set, 0
    included, always wins."""

    model_config = ConfigDict(extra="forbid")

    storage_gb_month: Usd | None = None
    retrieval_gb: Usd | None = None
    egress_gb: Usd | None = None
    min_storage_days: Count | None = None
    min_object_bytes: Count | None = None
    write_requests_per_1000: Usd | None = None
    read_requests_per_1000: Usd | None = None
    catalog: str | None = None

    @field_validator("catalog")
    @classmethod
    def _known_entry(cls, value: str | None) -> str | None:
        if value is None:
            return None
        key = known_entry(value)
        if key is None:
            raise ValueError(unknown_entry_message(value))
        return key


def _duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    return parse_duration(str(value))


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class ObjectLockConfig(BaseModel):
    """Placements the service makes on the tier are written under this retention."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["GOVERNANCE", "COMPLIANCE"]
    retain: Duration


class TierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    url: str
    storage_class: str | None = None
    endpoint_url: str | None = None
    # botocore's default request checksums, which some S3-compatible stores reject;
    # unset: "when_required" with an endpoint_url, "when_supported" on AWS itself.
    request_checksums: Literal["when_supported", "when_required"] | None = None
    price: PriceConfig = PriceConfig()
    # What the bucket keeps and refuses (DESIGN section 16): stated here, or read from the
    # bucket at start with `detect: true` (the stated figures win where both say).
    soft_delete: Duration | None = None
    versioned: bool | None = None
    keep_versions: bool = False
    noncurrent_expiry: Duration | None = None
    object_lock: ObjectLockConfig | None = None
    autoclass: bool | None = None
    detect: bool = False

    @field_validator("url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        _refuse_credentials(value)
        try:
            parse_url(value, field_name="url")
        except Invalid as error:
            raise ValueError(error.message) from None
        scheme, rest = value.split(":", 1)
        return f"{scheme.lower()}:{rest}".rstrip("/")  # FILE:// is file:// (Tier.is_local)

    @field_validator("endpoint_url")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            _refuse_credentials(value)
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{value!r} must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _options_fit_scheme(self) -> TierConfig:
        scheme = self.url.split(":", 1)[0]
        if scheme != "s3":
            for option in ("endpoint_url", "request_checksums"):
                if getattr(self, option) is not None:
                    raise ValueError(f"{option} applies to s3:// tiers only")
        if scheme == "file" and self.storage_class is not None:
            raise ValueError("storage_class applies to s3:// and gs:// tiers only")
        _check_provider_options(self, scheme)
        return self


def _check_provider_options(config: TierConfig, scheme: str) -> None:
    """Each bucket setting where its provider has it, and none that contradicts another."""
    only = {
        "soft_delete": ("gs",),
        "autoclass": ("gs",),
        "object_lock": ("s3",),
        "versioned": ("s3", "gs"),
        "detect": ("s3", "gs"),
    }
    for option, schemes in only.items():
        if getattr(config, option) not in (None, False) and scheme not in schemes:
            where = " and ".join(f"{s}://" for s in schemes)
            raise ValueError(f"{option} applies to {where} tiers only")
    if config.object_lock is not None and config.request_checksums == "when_required":
        raise ValueError(
            "object_lock needs request_checksums: when_supported (S3 refuses an upload with "
            "a retention period that carries no checksum)"
        )
    if config.object_lock is not None and config.versioned is False:
        raise ValueError("object_lock needs a versioned bucket: S3 turns versioning on with it")
    versioned = bool(config.versioned) or config.object_lock is not None
    if not versioned and not config.detect:
        for option in ("keep_versions", "noncurrent_expiry"):
            if getattr(config, option) not in (None, False):
                raise ValueError(f"{option} applies to a versioned bucket: set versioned: true")
    if config.noncurrent_expiry is not None and not config.keep_versions:
        raise ValueError(
            "noncurrent_expiry applies with keep_versions: true (otherwise a purge removes "
            "every version itself)"
        )
    if config.autoclass and config.storage_class is not None:
        raise ValueError(autoclass_refusal(config.storage_class))


class TiersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tiers: Annotated[list[TierConfig], Field(min_length=1)]

    @field_validator("tiers")
    @classmethod
    def _unique_names(cls, value: list[TierConfig]) -> list[TierConfig]:
        seen: set[str] = set()
        urls: dict[str, TierConfig] = {}
        for tier in value:
            if tier.name in seen:
                raise ValueError(f"tier name {tier.name!r} appears twice")
            seen.add(tier.name)
            # Two tiers on one place would make a move delete its own destination, unless
            # they are one bucket prefix in two storage classes: a move between them is
            # a class change in place.
            other = urls.get(tier.url)
            if other is not None and (
                tier.url.startswith("file:") or other.storage_class == tier.storage_class
            ):
                raise ValueError(
                    f"tiers {other.name!r} and {tier.name!r} share url {tier.url!r}"
                    + ("" if tier.url.startswith("file:") else " and storage class")
                )
            urls[tier.url] = tier
        return value


def _to_tier(config: TierConfig, rank: int) -> Tier:
    return Tier(
        name=config.name,
        url=config.url,
        rank=rank,
        storage_class=config.storage_class,
        endpoint_url=config.endpoint_url,
        # Object Lock needs a checksum on every upload (S3 refuses one without)
        request_checksums=config.request_checksums
        or (
            "when_required" if config.endpoint_url and not config.object_lock else "when_supported"
        ),
        price=Price(**config.price.model_dump()),
        provider=_provider(config),
        detect=config.detect,
    )


def _provider(config: TierConfig) -> ProviderSettings:
    lock = config.object_lock
    stated = any(
        value not in (None, False)
        for value in (
            config.soft_delete,
            config.versioned,
            config.keep_versions,
            config.noncurrent_expiry,
            lock,
            config.autoclass,
        )
    )
    return ProviderSettings(
        soft_delete=config.soft_delete,
        versioned=bool(config.versioned) or lock is not None,
        keep_versions=config.keep_versions,
        noncurrent_expiry=config.noncurrent_expiry,
        object_lock=ObjectLock(mode=lock.mode, retain=lock.retain) if lock else None,
        autoclass=bool(config.autoclass),
        source="tiers file" if stated else "default",
    )


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_tiers_file(path: Path) -> list[Tier]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise TiersFileError(f"tiers file {path}: cannot be read ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise TiersFileError(f"tiers file {path}: not valid YAML ({error})") from None
    if not isinstance(raw, dict):
        raise TiersFileError(f"tiers file {path}: must be a mapping with a `tiers` list")
    try:
        config = TiersConfig.model_validate(raw)
    except ValidationError as error:
        details = "; ".join(
            f"{_location(item['loc'])}: {str(item['msg']).removeprefix('Value error, ')}"
            for item in error.errors()
        )
        raise TiersFileError(f"tiers file {path}: {details}") from None
    return [_to_tier(tier, rank) for rank, tier in enumerate(config.tiers)]


def default_tiers(data_dir: Path) -> list[Tier]:
    root = data_dir.resolve()
    return [
        Tier(name=name, url=f"file://{root / name}", rank=rank)
        for rank, name in enumerate(DEFAULT_TIER_NAMES)
    ]


def load_tiers(settings: Settings) -> list[Tier]:
    """The configured tiers, hottest first; local tier directories are created."""
    if settings.tiers_file is not None:
        tiers = parse_tiers_file(settings.tiers_file)
    else:
        tiers = default_tiers(settings.data_dir)
    for tier in tiers:
        if tier.is_local:
            Path(tier.parsed.path).mkdir(parents=True, exist_ok=True)
    return tiers
