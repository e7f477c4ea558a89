"""The policy language (DESIGN section 7), validated with pydantic.

Validation needs the configured tier names: pass them as `context={"tiers": [...]}`
to `Policy.model_validate`. Anything unknown is refused with the rule and field named.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app.domain.duration import format_duration, parse_duration

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def _duration(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, timedelta):
        return value
    raise ValueError("must be a duration string such as 90s, 15m, 12h, 30d")


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^\d{1,6}[smhdw]$", "examples": ["7d", "12h"]}),
]


# Counts, steps and priorities fit a 64-bit integer, as the stored JSON does.
MAX_COUNT = 2**63 - 1


def _count(value: object) -> object:
    if isinstance(value, float) and value.is_integer():  # 3.0 is 3 to JSON Schema
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer >= 0, or -1 for all")
    if value < -1:
        raise ValueError(f"{value} is negative: use a count >= 0, or -1 for all")
    if value > MAX_COUNT:
        raise ValueError(f"at most {MAX_COUNT}")
    return value


Count = Annotated[
    int,
    BeforeValidator(_count),
    WithJsonSchema({"type": "integer", "minimum": -1, "maximum": MAX_COUNT}),
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppliesTo(Strict):
    projects: Annotated[list[str], Field(min_length=1)] = ["*"]
    labels: dict[str, str] = {}


class When(Strict):
    age: Duration | None = None
    run_ended: Duration | None = None
    run_status: list[Literal["active", "completed", "failed"]] | None = None
    on_tier: list[str] | None = None


class KeepBest(Strict):
    metric: Annotated[str, Field(min_length=1)]
    mode: Literal["min", "max"]
    count: Count


class KeepEvery(Strict):
    steps: Annotated[int, Field(ge=1, le=MAX_COUNT)]


class MoveTo(Strict):
    move_to: str


class CopyTo(Strict):
    copy_to: str


ACTIONS = "delete, {move_to: <tier>} or {copy_to: <tier>}"


def _action(value: object) -> object:
    """Refuse a misspelt action once, saying which actions exist, before the union tries
    each member and reports three failures that name pydantic's classes."""
    if value == "delete":
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((key, target),) = value.items()
        if key in ("move_to", "copy_to"):
            if not isinstance(target, str):
                raise ValueError(f"{key} takes a tier's name")
            return value
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ValueError(f"{shown} is not an action: the actions are {ACTIONS}")


Action = Annotated[Literal["delete"] | MoveTo | CopyTo, BeforeValidator(_action)]

CALENDAR_CLAUSES = ("keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly")


class Rule(Strict):
    name: Name
    class_: Annotated[str | list[str] | None, Field(alias="class")] = None
    when: When = When()
    keep_last: Count | None = None
    keep_best: KeepBest | None = None
    keep_every: KeepEvery | None = None
    keep_within: Duration | None = None
    keep_hourly: Count | None = None
    keep_daily: Count | None = None
    keep_weekly: Count | None = None
    keep_monthly: Count | None = None
    keep_yearly: Count | None = None
    action: Action

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def classes(self) -> frozenset[str] | None:
        if self.class_ is None:
            return None
        return frozenset([self.class_] if isinstance(self.class_, str) else self.class_)

    @property
    def target_tier(self) -> str | None:
        if isinstance(self.action, MoveTo):
            return self.action.move_to
        if isinstance(self.action, CopyTo):
            return self.action.copy_to
        return None

    @field_validator("action", mode="after")
    @classmethod
    def _known_tier(cls, value: Action, info: ValidationInfo) -> Action:
        tiers = (info.context or {}).get("tiers")
        target = value.move_to if isinstance(value, MoveTo) else getattr(value, "copy_to", None)
        if tiers is not None and target is not None and target not in tiers:
            raise ValueError(f"unknown tier {target!r}; configured tiers: {', '.join(tiers)}")
        return value

    @field_validator("when", mode="after")
    @classmethod
    def _known_on_tier(cls, value: When, info: ValidationInfo) -> When:
        tiers = (info.context or {}).get("tiers")
        for tier in value.on_tier or []:
            if tiers is not None and tier not in tiers:
                raise ValueError(f"on_tier: unknown tier {tier!r}")
        return value

    def describe_keeps(self) -> list[str]:
        parts = []
        if self.keep_last is not None:
            parts.append(f"keep_last {self.keep_last}")
        if self.keep_best is not None:
            kb = self.keep_best
            parts.append(f"keep_best {kb.count} by {kb.mode} {kb.metric}")
        if self.keep_every is not None:
            parts.append(f"keep_every {self.keep_every.steps} steps")
        if self.keep_within is not None:
            parts.append(f"keep_within {format_duration(self.keep_within)}")
        for clause in CALENDAR_CLAUSES:
            if getattr(self, clause) is not None:
                parts.append(f"{clause} {getattr(self, clause)}")
        return parts


Mode = Literal["enforce", "shadow"]


class Policy(Strict):
    name: Name
    description: str = ""
    # `shadow`: governs no run; evaluated beside the governing policy of the runs it would
    # govern, its would-be actions recorded and never carried out (DESIGN section 17)
    mode: Mode = "enforce"
    applies_to: AppliesTo = AppliesTo()
    priority: Annotated[int, Field(ge=-MAX_COUNT, le=MAX_COUNT)] = 0
    rules: list[Rule] = []

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"

    @model_validator(mode="after")
    def _unique_rule_names(self) -> Policy:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} appears twice")
            seen.add(rule.name)
        return self


def policy_json_schema() -> dict[str, Any]:
    return Policy.model_json_schema(by_alias=True)
