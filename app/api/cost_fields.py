"""The fields of the cost endpoints' bodies: sizes that may be written as JSON numbers like
1e12 but must be whole, bounded money and ratios, durations and checkpoint intervals."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from app.api.schemas import (
    NAME_PATTERN,
)
from app.cost.forecast import MAX_DAYS
from app.domain.duration import parse_duration

MAX_BYTES = 10**18


def whole(value: object) -> object:
    """A whole JSON number: 1e12 is 10^12; 1.5, "7" and true are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a whole number")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


def _duration(value: str) -> str:
    if parse_duration(value) <= timedelta(0):
        raise ValueError("must be longer than 0s")
    return value


def _interval(value: str) -> str:
    return value if value == "end" else _duration(value)


def policy_ref(value: object) -> object:
    """A policy's name or a policy object: anything else is refused here, once, under
    `policy` (not once per member of the union)."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        if re.fullmatch(NAME_PATTERN, value):
            return value
        raise ValueError(f"{value[:80]!r} is not a policy name (pattern {NAME_PATTERN})")
    raise ValueError("must be a policy's name or a policy object")


Whole = Annotated[int, Field(ge=1, le=MAX_BYTES), BeforeValidator(whole)]
Positive = Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False, strict=True)]
# Bounded so that their product is a checkpoint of at most MAX_BYTES, as the document says:
# 10^16 parameters (10,000 times the largest models) at 1 to 100 bytes each (a checkpoint
# of at least one byte).
Parameters = Annotated[int, Field(ge=1, le=10**16), BeforeValidator(whole)]
PerParameter = Annotated[float, Field(ge=1, le=100, allow_inf_nan=False, strict=True)]
Money = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)]
Days = Annotated[int, Field(ge=1, le=MAX_DAYS), BeforeValidator(whole)]
# What parse_duration reads and _duration keeps, said in the document (a longer one is
# refused as too long, a zero one as empty).
DURATION_PATTERN = r"^[1-9][0-9]{0,5}[smhdw]$"
DurationText = Annotated[
    str,
    Field(max_length=32, pattern=DURATION_PATTERN, examples=["1h", "24h"]),
    AfterValidator(_duration),
]
Interval = Annotated[
    str,
    Field(max_length=32, pattern=r"^(end|[1-9][0-9]{0,5}[smhdw])$", examples=["3h", "1d", "end"]),
    AfterValidator(_interval),
]
# How long a provider bills deleted bytes: a duration parse_duration reads, `0s` included.
BilledFor = Annotated[
    str, Field(max_length=32, pattern=r"^[0-9]{1,6}[smhdw]$", examples=["7d", "0s"])
]
# A tier's name, or `*` for every tier (app.services.cost.inputs.tier_prices says how they layer).
PricedTier = Annotated[str, Field(pattern=rf"^(\*|{NAME_PATTERN[1:-1]})$", examples=["*", "cold"])]
Recipe = Literal["fp32-master-adam", "bf16-fp32-master-adam", "zero-mixed-adam"]
