from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.duration import format_duration, parse_duration

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_SECONDS = timedelta.max.days * 86400 + timedelta.max.seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("30d", timedelta(days=30)),
        ("0s", timedelta(0)),
        ("2w", timedelta(weeks=2)),
        ("1s", timedelta(seconds=1)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=15), "15m"),
        (timedelta(hours=12), "12h"),
        (timedelta(days=30), "30d"),
        (timedelta(0), "0s"),
        (timedelta(weeks=2), "2w"),
        (timedelta(minutes=1), "1m"),
        (timedelta(hours=36), "36h"),
        (timedelta(days=7), "1w"),
    ],
)
def test_format_duration_uses_largest_exact_unit(value: timedelta, expected: str) -> None:
    assert format_duration(value) == expected


@pytest.mark.parametrize("text", ["5", "5x", "-1d", "1.5h", "", " d", "d5", "5 d", "1h30m", "5D"])
def test_malformed_duration_is_refused_readably(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "malformed duration" in message
    assert "90s" in message  # shows an example of the expected form


def test_non_string_duration_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="malformed duration"):
        parse_duration(5)  # type: ignore[arg-type]


def test_duration_too_long_for_timedelta_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("999999999w")


@given(
    number=st.integers(min_value=0, max_value=10**15 - 1),
    unit=st.sampled_from(sorted(UNIT_SECONDS)),
)
def test_round_trip_from_text(number: int, unit: str) -> None:
    text = f"{number}{unit}"
    if number * UNIT_SECONDS[unit] > MAX_SECONDS:
        with pytest.raises(ValueError, match="too long"):
            parse_duration(text)
        return
    value = parse_duration(text)
    assert value == timedelta(seconds=number * UNIT_SECONDS[unit])
    canonical = format_duration(value)
    assert parse_duration(canonical) == value
    assert format_duration(parse_duration(canonical)) == canonical


@given(seconds=st.integers(min_value=0, max_value=MAX_SECONDS))
def test_round_trip_from_timedelta(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    text = format_duration(value)
    assert parse_duration(text) == value
    number, unit = int(text[:-1]), text[-1]
    # the largest exact unit: the next larger one would not divide the value
    larger = [u for u in UNIT_SECONDS.values() if u > UNIT_SECONDS[unit]]
    assert seconds == 0 or all(seconds % u for u in larger)
    assert number * UNIT_SECONDS[unit] == seconds
