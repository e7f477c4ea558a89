"""Request and response bodies of API v1. Unknown fields are refused so typos surface."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, NotRequired, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import TypedDict

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
MAX_INT64 = 2**63 - 1

Name = Annotated[str, Field(pattern=NAME_PATTERN, examples=["llama-70b"])]
RunStatus = Literal["active", "completed", "failed"]
CheckpointState = Literal["writing", "active", "trashed", "deleted"]


def whole(value: object) -> object:
    """A JSON integer: 100, or 100.0 (the same number to JSON Schema, and so to generated
    clients); "100", 1.5 and true are client bugs, not numbers to guess."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


Count = Annotated[int, Field(ge=0, le=MAX_INT64), BeforeValidator(whole)]
# A NUL cannot be stored in a PostgreSQL text or jsonb value: refused like in `uri`.
NO_NUL = r"^[^\x00]*$"
LabelKey = Annotated[str, Field(min_length=1, max_length=63, pattern=NO_NUL)]
LabelValue = Annotated[str, Field(max_length=256, pattern=NO_NUL)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=64)]  # MAX_LABELS


MAX_LABELS = 64
MAX_METRICS = 256


def _finite(value: dict[str, float | None]) -> dict[str, float | None]:
    for name, number in value.items():
        if number is not None and not math.isfinite(number):
            raise ValueError(f"metric {name!r} must be a finite number")
    return value


MetricKey = Annotated[str, Field(min_length=1, max_length=63, pattern=NO_NUL)]
MetricValue = Annotated[float, Field(strict=True)]
Metrics = Annotated[
    dict[MetricKey, MetricValue], Field(max_length=MAX_METRICS), AfterValidator(_finite)
]
# A PATCH merges into what a checkpoint has: a key given null is removed.
LabelsPatch = Annotated[
    dict[LabelKey, LabelValue | None],
    Field(
        max_length=MAX_LABELS, description="merged into the labels; a null value removes the key"
    ),
]
MetricsPatch = Annotated[
    dict[MetricKey, MetricValue | None],
    Field(
        max_length=MAX_METRICS, description="merged into the metrics; a null value removes the key"
    ),
    AfterValidator(_finite),
]


RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?")


def _iso(value: object) -> object:
    """Only an ISO 8601 date and time: pydantic would read 1700000000 or "0.5" as seconds
    since 1970, which no caller means."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and RFC3339.fullmatch(value):
        return value
    raise ValueError("must be an ISO 8601 date and time, such as 2026-01-02T03:04:05Z")


def _utc(value: datetime) -> datetime:
    """Timestamps are UTC; a value without an offset is taken as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Timestamp = Annotated[datetime, BeforeValidator(_iso), AfterValidator(_utc)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Rules between fields, in JSON Schema, for the document: an optional field left out and
# one sent as null mean the same to the service.
def present(name: str) -> dict[str, Any]:
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def absent(*names: str) -> dict[str, Any]:
    return {"properties": {name: {"type": "null"} for name in names}}


def not_both(a: str, b: str) -> dict[str, Any]:
    return {"not": {"allOf": [present(a), present(b)]}}


def only_with(name: str, needed: str) -> dict[str, Any]:
    return {"anyOf": [absent(name), present(needed)]}


class RunCreate(Strict):
    project: Name
    name: Name
    labels: Labels = Field(default_factory=dict)
    policy: Name | None = None
    resumed_from: Annotated[str, Field(max_length=40)] | None = None
    started_at: Timestamp | None = Field(
        default=None,
        description="when the run began (an adopted or back-filled run); now if left out",
    )


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # "left out", not a null the schema does not allow


class RunUpdate(Strict):
    # status and labels cannot be cleared: the document offers no null for them (the
    # service refuses one with 422), while `policy: null` and `resumed_from: null` clear.
    status: RunStatus | SkipJsonSchema[None] = Field(None, json_schema_extra=_no_default)
    labels: Labels | SkipJsonSchema[None] = Field(None, json_schema_extra=_no_default)
    policy: Name | None = None
    resumed_from: Annotated[str, Field(max_length=40)] | None = None
    ended_at: Timestamp | None = None


class RunRead(BaseModel):
    id: str
    project: str
    name: str
    status: RunStatus
    labels: dict[str, str]
    policy: str | None
    resumed_from: str | None
    started_at: datetime
    ended_at: datetime | None
    created_by: str | None = Field(description="who registered it (see access control)")
    updated_by: str | None = Field(description="who changed it last")


# What _relative_path accepts, for the document (the validator keeps its plainer messages).
_SEGMENT = r"(?:[^/\\\x00.][^/\\\x00]*|\.[^/\\\x00.][^/\\\x00]*|\.\.[^/\\\x00]+)"
RELATIVE_PATH = f"^{_SEGMENT}(?:/{_SEGMENT})*$"


def _relative_path(value: str) -> str:
    if value.startswith("/") or "\\" in value or "\x00" in value:
        raise ValueError("must be a relative path with '/' separators")
    parts = value.split("/")
    if ".." in parts or "." in parts or "" in parts:
        raise ValueError("must not contain '..', '.' or empty segments")
    return value


class FileEntry(TypedDict):
    """One file of a manifest. A TypedDict, not a model: a registration carries dozens and
    the service keeps them as plain dicts anyway."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    path: Annotated[
        str,
        Field(
            min_length=1,
            max_length=1024,
            json_schema_extra={"pattern": RELATIVE_PATH},
            description="relative, '/' separated, no '.', '..' or empty segments",
        ),
        AfterValidator(_relative_path),
    ]
    size_bytes: Count
    sha256: NotRequired[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    crc32c: NotRequired[Annotated[str, Field(pattern=r"^[0-9a-f]{8}$")]]
    # S3's full-object CRC64NVME, as the registration lists it from S3 (16 hex digits)
    crc64nvme: NotRequired[Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]]


Manifest = Annotated[list[FileEntry], Field(max_length=100_000)]


class CheckpointCreate(Strict):
    step: Count
    class_: Annotated[Name, Field(alias="class")]
    uri: Annotated[str, Field(min_length=1, max_length=2048)]
    files: Manifest | None = None
    size_bytes: Count | None = None
    metrics: Metrics = Field(default_factory=dict)
    labels: Labels = Field(default_factory=dict)
    created_at: Timestamp | None = None
    committed: Annotated[bool, Field(strict=True)] = True

    model_config = ConfigDict(extra="forbid")


class CheckpointCommit(Strict):
    files: Manifest | None = None
    size_bytes: Count | None = None
    metrics: Metrics | None = None


class CheckpointUpdate(Strict):
    """Re-class a checkpoint, merge labels and metrics. Neither field can be null as a
    whole (the document offers none; the service refuses one with 422)."""

    class_: Name | SkipJsonSchema[None] = Field(None, alias="class", json_schema_extra=_no_default)
    labels: LabelsPatch | SkipJsonSchema[None] = Field(None, json_schema_extra=_no_default)
    metrics: MetricsPatch | SkipJsonSchema[None] = Field(None, json_schema_extra=_no_default)


class AbortRequest(Strict):
    reason: Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)] | None = Field(
        None, description="why the save failed, for the audit trail"
    )


class PinCreate(Strict):
    reason: Annotated[str, Field(min_length=1, max_length=500)]

    @field_validator("reason")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:  # a text column cannot hold one on PostgreSQL
            raise ValueError("must not contain NUL characters")
        return value


class LocationRead(BaseModel):
    tier: str
    uri: str
    storage_class: str | None
    role: Literal["primary", "replica"]


class CheckpointRead(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    run_id: str
    step: int
    class_: str = Field(alias="class", serialization_alias="class")
    state: CheckpointState
    uri: str
    size_bytes: int
    files: list[dict[str, Any]] | None
    metrics: dict[str, float]
    labels: dict[str, str]
    pinned: bool
    pin_reason: str | None
    created_at: datetime
    tier: str | None
    locations: list[LocationRead]
    created_by: str | None = Field(description="who registered it (see access control)")
    updated_by: str | None = Field(description="who changed it last")
    health: Literal["ok", "drift"] = Field(
        description="`drift` when the last reconciliation found a catalogued object missing "
        "or changed (see `health_detail`)"
    )
    health_detail: str | None
    protected_until: datetime | None = Field(
        default=None,
        description="set by an undelete: no policy deletes or moves it before this time",
    )
    locked_until: datetime | None = Field(
        default=None,
        description="the provider refused to delete its bytes (Object Lock retention or a "
        "legal hold), or the service wrote them locked: no policy deletes or moves it before "
        "this time (`lock_reason` says why)",
    )
    lock_reason: str | None = None
    reserved_until: datetime | None = Field(
        default=None,
        description="a `writing` checkpoint's reservation ends then unless kept alive or "
        "committed (the scheduler aborts it as abandoned); null in every other state",
    )


class PriceRead(BaseModel):
    storage_gb_month: float
    retrieval_gb: float
    egress_gb: float
    min_storage_days: int


class TierUsage(BaseModel):
    bytes: int
    checkpoints: int


class ObjectLockRead(BaseModel):
    mode: Literal["GOVERNANCE", "COMPLIANCE"]
    retain: str  # a duration, "30d"


class ProviderSettingsRead(BaseModel):
    """What the bucket keeps and refuses, and where the service learnt it: `source` is
    "tiers file", "bucket" (read at start) or "default" (a plain bucket). `billed_after_delete`
    is how long a deleted checkpoint's bytes stay billed ("0s"), null when for ever
    (noncurrent versions that nothing expires)."""

    soft_delete: str | None
    versioned: bool
    keep_versions: bool
    noncurrent_expiry: str | None
    object_lock: ObjectLockRead | None
    autoclass: bool
    billed_after_delete: str | None
    source: Literal["default", "tiers file", "bucket"]


class TierRead(BaseModel):
    name: str
    url: str
    rank: int
    storage_class: str | None
    endpoint_url: str | None
    price: PriceRead
    usage: TierUsage
    provider: ProviderSettingsRead


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None


class Health(BaseModel):
    status: Literal["ok"]


ScopeName = Literal["read", "register", "admin"]
ProjectGrant = Annotated[str, Field(pattern=r"^(\*|[a-z0-9][a-z0-9._-]{0,62})$")]


ADMIN_IN_SCOPES: dict[str, Any] = {"properties": {"scopes": {"contains": {"const": "admin"}}}}


class TokenCreate(Strict):
    """`projects` is required unless the scopes hold admin, whose only grant is ["*"];
    "*" stands alone."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {"anyOf": [present("projects"), ADMIN_IN_SCOPES]},
                {
                    "anyOf": [
                        {"not": ADMIN_IN_SCOPES},
                        {
                            "properties": {
                                "projects": {"anyOf": [{"type": "null"}, {"items": {"const": "*"}}]}
                            }
                        },
                    ]
                },
                {
                    "properties": {
                        "projects": {
                            "anyOf": [
                                {"type": "null"},
                                {"items": {"const": "*"}},
                                {"items": {"not": {"const": "*"}}},
                            ]
                        }
                    }
                },
            ]
        },
    )

    name: Name
    scopes: Annotated[list[ScopeName], Field(min_length=1, max_length=3)]
    projects: (
        Annotated[
            list[ProjectGrant],
            Field(
                min_length=1,
                max_length=1000,
                description='project names, or ["*"] for all; admin tokens take only ["*"]',
            ),
        ]
        | None
    ) = None


class TokenRead(BaseModel):
    """A token as listed: never its secret, nor the hash of it."""

    id: str
    name: str
    scopes: list[str]
    projects: list[str]
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None


class TokenCreated(TokenRead):
    token: str = Field(description="the secret, shown in this answer only: store it now")
