"""Sizing (section 7b) against figures worked by hand from sections 1 and 7b: a 70B model,
12-16 bytes per parameter; 405B at 12 is ~4.9 TB; Young/Daly and synchronous stalls."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import get_args

import pytest

from app.api.cost_fields import Recipe
from app.cost.planner import (
    BYTES_PER_PARAMETER,
    SizingInputs,
    checkpoint_bytes,
    size,
    sync_stall_gpu_hours,
    write_bandwidth,
    young_daly_interval,
)

B = 10**9


@pytest.mark.parametrize(
    ("parameters", "per_parameter", "expected"),
    [
        (70 * B, 12, 840 * B),  # section 1: ~0.84 TB, fp32 master + Adam moments
        (70 * B, 14, 980 * B),  # with the bf16 working copy (the default)
        (70 * B, 16, 1120 * B),  # ZeRO's count, gradients included: ~1 TB
        (405 * B, 12, 4860 * B),  # section 1: ~4.9 TB
        (7 * B, 12, 84 * B),  # 7B: ~84 GB
        (70 * B, 2, 140 * B),  # deployed in bf16: 140 GB
    ],
)
def test_checkpoint_bytes(parameters: int, per_parameter: int, expected: int) -> None:
    assert checkpoint_bytes(parameters, per_parameter) == expected


def test_recipes_name_12_14_and_16_bytes() -> None:
    assert BYTES_PER_PARAMETER == {
        "fp32-master-adam": 12,
        "bf16-fp32-master-adam": 14,
        "zero-mixed-adam": 16,
    }
    assert set(get_args(Recipe)) == set(BYTES_PER_PARAMETER)


def test_write_bandwidth_for_a_cadence_and_an_overlap() -> None:
    """980 GB every hour, writing at most 10% of the time: 980e9 / 360 s = 2.72 GB/s."""
    assert write_bandwidth(980 * B, timedelta(hours=1), 0.1) == pytest.approx(980e9 / 360)


def test_young_daly_interval() -> None:
    """A 60 s write and a failure a day: sqrt(2 x 60 x 86,400) = 3,219.9 s (53.7 min)."""
    assert young_daly_interval(60, timedelta(hours=24)) == pytest.approx(math.sqrt(10_368_000))
    assert young_daly_interval(60, timedelta(hours=24)) == pytest.approx(3219.94, abs=0.01)


def test_synchronous_stall() -> None:
    """1,000 saves of 30 s on 8 GPUs: 66.7 GPU-hours; at $4.06 per GPU-hour, $270.67."""
    assert sync_stall_gpu_hours(1000, 30, 8) == pytest.approx(1000 * 30 * 8 / 3600)
    result = size(
        SizingInputs(checkpoint_write_seconds=30, checkpoints=1000, gpus=8, usd_per_gpu_hour=4.06)
    )
    assert result.sync_stall_gpu_hours == pytest.approx(66.6667, abs=1e-4)
    assert result.sync_stall_usd == pytest.approx(270.6667, abs=1e-4)


def test_every_output_at_once() -> None:
    result = size(
        SizingInputs(
            parameters=70 * B,
            interval=timedelta(hours=1),
            allowed_overlap=0.1,
            checkpoint_write_seconds=60,
            mtbf=timedelta(hours=24),
            checkpoints=1000,
            gpus=8,
            usd_per_gpu_hour=4.06,
        )
    )
    assert result.bytes_per_parameter == 14
    assert result.checkpoint_bytes == 980 * B
    assert result.write_bandwidth_bytes_per_s == pytest.approx(2.7222e9, rel=1e-4)
    assert result.young_daly_interval_s == pytest.approx(3219.94, abs=0.01)
    assert result.sync_stall_gpu_hours == pytest.approx(133.333, abs=1e-3)
    assert result.sync_stall_usd == pytest.approx(541.333, abs=1e-3)
    assert result.incomplete == {}


def test_outputs_appear_only_with_all_their_inputs() -> None:
    result = size(SizingInputs(parameters=70 * B, interval=timedelta(hours=1)))
    assert result.checkpoint_bytes == 980 * B
    assert result.write_bandwidth_bytes_per_s is None
    assert result.incomplete == {"write_bandwidth_bytes_per_s": ["allowed_overlap"]}


def test_a_given_checkpoint_size_needs_no_parameters() -> None:
    result = size(
        SizingInputs(checkpoint_bytes=10**12, interval=timedelta(hours=3), allowed_overlap=0.05)
    )
    assert result.bytes_per_parameter is None
    assert result.write_bandwidth_bytes_per_s == pytest.approx(1e12 / (0.05 * 3 * 3600))


def test_an_unrelated_input_does_not_make_an_output_incomplete() -> None:
    """A write time with an MTBF is a Young/Daly question, not a stall question."""
    result = size(SizingInputs(checkpoint_write_seconds=60, mtbf=timedelta(hours=6)))
    assert result.young_daly_interval_s == pytest.approx(math.sqrt(2 * 60 * 6 * 3600))
    assert result.incomplete == {}
    partial = size(SizingInputs(checkpoints=100, usd_per_gpu_hour=2.0))
    assert partial.incomplete == {
        "sync_stall_gpu_hours": ["checkpoint_write_seconds", "gpus"],
        "sync_stall_usd": ["checkpoint_write_seconds", "gpus"],
    }
