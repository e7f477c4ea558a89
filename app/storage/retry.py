"""Exponential backoff with full jitter for throttling and transient provider errors.

Adapters translate provider errors into TransientError (503 SlowDown, 429, other 5xx,
timeouts, reset connections) and wrap each idempotent call in `retrying`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from app.storage.base import TransientError

T = TypeVar("T")
log = logging.getLogger("app.storage")

ATTEMPTS = 6
BASE_DELAY = 0.1
MAX_DELAY = 5.0


def backoff(attempt: int, *, base: float = BASE_DELAY, cap: float = MAX_DELAY) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * (2**attempt)))


def retrying(
    call: Callable[[], T],
    *,
    what: str,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `call`, retrying TransientError up to `attempts` times in all."""
    for attempt in range(attempts):
        try:
            return call()
        except TransientError as error:
            if attempt + 1 >= attempts:
                raise
            delay = backoff(attempt)
            log.info(
                "transient storage error, retrying",
                extra={
                    "operation": what,
                    "attempt": attempt + 1,
                    "delay_s": round(delay, 3),
                    "error": str(error),
                },
            )
            sleep(delay)
    raise AssertionError("unreachable")
