"""Exponential backoff with full jitter for throttling and transient provider errors.

Adapters translate provider errors into TransientError (503 SlowDown, 429, other 5xx,
timeouts, reset connections) and wrap each idempotent call in `retrying`.

Every retry is counted twice: in the process's `ckpt_storage_retries_total` metric, and in
the tally of whoever asked with `counting_retries()` (the executor, per action). The tally
lives in a context variable, so work handed to a thread pool counts in the caller's tally
only when the pool runs it through `in_this_context`, as every adapter pool here does.
"""

from __future__ import annotations

import contextvars
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from app import metrics
from app.storage.base import TransientError

T = TypeVar("T")
P = ParamSpec("P")
log = logging.getLogger("app.storage")

ATTEMPTS = 6
BASE_DELAY = 0.1
MAX_DELAY = 5.0


class RetryTally:
    """How many transient errors were retried; shared by every thread of one piece of work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def add(self) -> None:
        with self._lock:
            self._count += 1


_tally: contextvars.ContextVar[RetryTally | None] = contextvars.ContextVar(
    "storage_retry_tally", default=None
)


@contextmanager
def counting_retries() -> Iterator[RetryTally]:
    """Count the retries made inside the block (and in the pools it runs through
    `in_this_context`). Nested blocks each count their own."""
    tally = RetryTally()
    token = _tally.set(tally)
    try:
        yield tally
    finally:
        _tally.reset(token)


def in_this_context(call: Callable[P, T]) -> Callable[P, T]:
    """`call`, run in a copy of the context of the thread that wrapped it: work handed to a
    thread pool keeps counting its retries in its caller's tally. Each run gets its own
    copy, so one wrapped callable may run on many threads at once."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return context.copy().run(call, *args, **kwargs)

    return run


# The first words of an adapter's `what` -> the kind of operation it is (metric label).
_OPERATIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        (r"^(HeadObject|head)\b", "head"),
        (r"^(ListObjectsV2|ListMultipartUploads|list)\b", "list"),
        (r"^(GetObject|read)\b", "read"),
        (r"^(UploadPartCopy|CopyObject|copy|multipart copy|set class)\b", "copy"),
        (r"^(PutObject|UploadPart|CreateMultipartUpload|CompleteMultipartUpload)\b", "write"),
        (r"^(upload|multipart upload)\b", "write"),
        (r"^(DeleteObjects?|AbortMultipartUpload|delete|batch delete)\b", "delete"),
        (r"^(RestoreObject|restore)\b", "restore"),
    )
)
_SCHEMES = (("s3://", "s3"), ("gs://", "gs"), ("file://", "file"))


def classify(what: str) -> tuple[str, str]:
    """(operation kind, provider) of an adapter's description of a call, such as
    "PutObject s3://bucket/key" -> ("write", "s3"); "other"/"unknown" when not recognised."""
    operation = next((kind for pattern, kind in _OPERATIONS if pattern.match(what)), "other")
    scheme = next((name for marker, name in _SCHEMES if marker in what), None)
    return operation, metrics.provider(scheme) if scheme is not None else "unknown"


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
            operation, provider = classify(what)
            metrics.storage_retried(operation, provider)
            tally = _tally.get()
            if tally is not None:
                tally.add()
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
