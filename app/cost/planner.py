"""Sizing before a run starts (section 7b): checkpoint size, the write bandwidth a cadence
needs, the Young/Daly checkpoint interval, and what synchronous saves stall. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

# Bytes of resumable state per parameter with Adam (ZeRO's accounting): fp32 master
# weights and the two fp32 moments (4 + 4 + 4); with the bf16 working copy (+ 2); with
# the fp16/bf16 gradients as ZeRO counts them (+ 2).
BYTES_PER_PARAMETER = {
    "fp32-master-adam": 12,
    "bf16-fp32-master-adam": 14,
    "zero-mixed-adam": 16,
}
DEFAULT_BYTES_PER_PARAMETER = 14


@dataclass(frozen=True, slots=True)
class SizingInputs:
    """Inputs; any may be missing. Each output needs all of its own inputs."""

    parameters: int | None = None
    bytes_per_parameter: float | None = None
    checkpoint_bytes: int | None = None
    interval: timedelta | None = None
    allowed_overlap: float | None = None
    checkpoint_write_seconds: float | None = None
    mtbf: timedelta | None = None
    checkpoints: int | None = None
    gpus: int | None = None
    usd_per_gpu_hour: float | None = None


@dataclass(frozen=True, slots=True)
class Sizing:
    """The outputs whose inputs were given (None otherwise)."""

    bytes_per_parameter: float | None = None
    checkpoint_bytes: int | None = None
    write_bandwidth_bytes_per_s: float | None = None
    young_daly_interval_s: float | None = None
    sync_stall_gpu_hours: float | None = None
    sync_stall_usd: float | None = None
    incomplete: dict[str, list[str]] = field(default_factory=dict)  # output -> missing inputs


def checkpoint_bytes(parameters: int, bytes_per_parameter: float) -> int:
    """parameters x bytes per parameter (a 70B model at 14: 980 GB)."""
    return round(parameters * bytes_per_parameter)


def write_bandwidth(size_bytes: float, interval: timedelta, allowed_overlap: float) -> float:
    """Bytes per second that write a checkpoint within `allowed_overlap` of each interval."""
    return size_bytes / (allowed_overlap * interval.total_seconds())


def young_daly_interval(write_seconds: float, mtbf: timedelta) -> float:
    """sqrt(2 x write time x MTBF), in seconds: the interval that loses least to saving
    plus recomputing after a failure."""
    return math.sqrt(2 * write_seconds * mtbf.total_seconds())


def sync_stall_gpu_hours(checkpoints: int, write_seconds: float, gpus: int) -> float:
    """GPU-hours spent idle while synchronous saves write."""
    return checkpoints * write_seconds * gpus / 3600


def size(inputs: SizingInputs) -> Sizing:
    """Every output whose inputs are all given. An output some of whose own inputs were
    given, but not all, is listed in `incomplete` with the inputs it still needs."""
    s = inputs
    incomplete: dict[str, list[str]] = {}

    def complete(output: str, own: tuple[str, ...], values: dict[str, object]) -> bool:
        absent = [name for name, value in values.items() if value is None]
        if absent and any(values[name] is not None for name in own):
            incomplete[output] = absent
        return not absent

    per_parameter = s.bytes_per_parameter
    size_bytes = s.checkpoint_bytes
    if s.parameters is not None:
        if per_parameter is None:
            per_parameter = DEFAULT_BYTES_PER_PARAMETER
        size_bytes = checkpoint_bytes(s.parameters, per_parameter)
    out: dict[str, float | None] = {}
    if complete(
        "write_bandwidth_bytes_per_s",
        ("interval", "allowed_overlap"),
        {
            "checkpoint_bytes": size_bytes,
            "interval": s.interval,
            "allowed_overlap": s.allowed_overlap,
        },
    ):
        assert size_bytes is not None and s.interval is not None and s.allowed_overlap is not None
        out["write_bandwidth_bytes_per_s"] = write_bandwidth(
            size_bytes, s.interval, s.allowed_overlap
        )
    if complete(
        "young_daly_interval_s",
        ("mtbf",),
        {"checkpoint_write_seconds": s.checkpoint_write_seconds, "mtbf": s.mtbf},
    ):
        assert s.checkpoint_write_seconds is not None and s.mtbf is not None
        out["young_daly_interval_s"] = young_daly_interval(s.checkpoint_write_seconds, s.mtbf)
    stall_inputs: dict[str, object] = {
        "checkpoint_write_seconds": s.checkpoint_write_seconds,
        "checkpoints": s.checkpoints,
        "gpus": s.gpus,
    }
    if complete("sync_stall_gpu_hours", ("checkpoints", "gpus"), stall_inputs):
        assert s.checkpoint_write_seconds is not None
        assert s.checkpoints is not None and s.gpus is not None
        hours = sync_stall_gpu_hours(s.checkpoints, s.checkpoint_write_seconds, s.gpus)
        out["sync_stall_gpu_hours"] = hours
    if complete(
        "sync_stall_usd",
        ("usd_per_gpu_hour",),
        {**stall_inputs, "usd_per_gpu_hour": s.usd_per_gpu_hour},
    ):
        assert s.usd_per_gpu_hour is not None
        out["sync_stall_usd"] = (out["sync_stall_gpu_hours"] or 0.0) * s.usd_per_gpu_hour
    return Sizing(
        bytes_per_parameter=per_parameter if s.parameters is not None else None,
        checkpoint_bytes=size_bytes,
        incomplete=incomplete,
        **out,
    )
