"""Durations as the contract writes them: `90s`, `15m`, `12h`, `30d`, `0s`."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^(\d{1,15})([smhdw])$")  # 15 digits: any timedelta in seconds


def parse_duration(text: str) -> timedelta:
    """Parse a duration string; raises ValueError with a readable message."""
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"malformed duration {text!r}: expected a whole number and a unit s, m, h, d or w "
            "(e.g. 90s, 15m, 12h, 30d)"
        )
    try:
        return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long (at most 999999999d)") from None


def format_duration(value: timedelta) -> str:
    """Inverse of parse_duration, choosing the largest exact unit."""
    seconds = int(value.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def format_instant(value: datetime) -> str:
    """A UTC instant as reasons and messages print it: `2026-12-08T20:25:17Z`."""
    return f"{value.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
