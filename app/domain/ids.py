"""Opaque, time-ordered ids: newer ids sort after older ones, which keeps pagination cheap."""

from __future__ import annotations

import os
import time


def new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{os.urandom(8).hex()}"
