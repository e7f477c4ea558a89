"""One HTTP call to the catalog, retried until its deadline.

Every call of the API is idempotent (the same registration again answers 200 with the same
checkpoint), so anything that may be transient is retried the same way whatever the method:
connection failures and timeouts, 429 and every 5xx. Pauses follow exponential backoff with
full jitter (a random pause between 0 and the doubled cap), so the many ranks of a job that
lost the service together do not come back in lockstep. A call ends by its deadline: each
attempt's own timeout is cut to what is left, so a hung service cannot hold a training step
longer than that.
"""

from __future__ import annotations

import json as jsonlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from ckpt_client.errors import Unavailable, error_for

log = logging.getLogger("ckpt_client")

VERSION = "0.1.0"
RETRIED_STATUSES = frozenset({429})  # and every status >= 500
# Failures that leave no doubt the request never reached the service.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class Answer:
    """A successful answer: its status, its JSON body (None when empty) and the service's
    clock from the `Date` header (None when absent), which times keepalives without
    trusting the local clock to agree with the service's."""

    status: int
    body: Any
    server_time: datetime | None


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        # a proxy's HTML page, say: keep a little of it for the message
        return {"detail": response.text[:300]} if response.text else {}
    return body if isinstance(body, dict) else {"detail": str(body)[:300]}


def _server_time(response: httpx.Response) -> datetime | None:
    value = response.headers.get("date")
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def segment(value: str) -> str:
    """An id as one path segment: ids are opaque, so nothing in one may reach the path."""
    return quote(value, safe="")


def redact(url: str) -> str:
    """`url` without a password it might carry (`https://user:secret@host`): for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class Transport:
    """The HTTP connection pool and the retry loop. Thread-safe (httpx's pool is), so a
    reservation's keepalive thread shares it with the training loop."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout: float,
        deadline: float,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        http_transport: httpx.BaseTransport | None = None,
        user_agent: str = f"ckpt-client/{VERSION}",
    ) -> None:
        headers = {"user-agent": user_agent, "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self.url = url
        self.shown_url = redact(url)
        self.timeout = timeout
        self.deadline = deadline
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, transport=http_transport
        )

    def close(self) -> None:
        self._http.close()

    def deadline_at(self, deadline: float | None = None) -> float:
        """The monotonic time a call started now must end by."""
        return time.monotonic() + (self.deadline if deadline is None else deadline)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        deadline_at: float | None = None,
        idempotent: bool = True,
    ) -> Answer:
        """Send one call, retrying what may be transient until `deadline_at` (a
        `time.monotonic()` value; the transport's deadline from now by default).

        Raises the matching `CatalogError` subclass for a refusal (4xx), at once and without
        a retry, and `Unavailable` once the deadline has passed without an answer. A call
        that is not `idempotent` (creating a token: a second attempt makes a second one) is
        retried only where it surely did not reach the service (no connection, a 429); any
        other failure raises `Unavailable` at once."""
        until = self.deadline_at() if deadline_at is None else deadline_at
        what = f"{method} {path}"
        attempt = 0
        status: int | None = None
        problem: dict[str, Any] = {}
        reason = "the deadline had passed before the first attempt"
        while True:
            remaining = until - time.monotonic()
            if remaining <= 0:
                raise Unavailable(
                    f"{what}: the catalog at {self.shown_url} did not answer in time ({reason})",
                    status=status,
                    problem=problem,
                )
            pause_at_least = 0.0
            try:
                response = self._http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    timeout=min(self.timeout, max(remaining, 0.001)),
                )
            except httpx.TransportError as error:
                reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                if not idempotent and not isinstance(error, NOT_SENT):
                    raise Unavailable(
                        f"{what}: no answer from {self.shown_url} ({reason}); it may have "
                        "been done: look before you repeat it",
                    ) from None
            else:
                if response.status_code < 400:
                    return self._answer(response)
                problem = _problem(response)
                status = response.status_code
                if status not in RETRIED_STATUSES and status < 500:
                    raise error_for(status, problem, what)
                reason = f"{status} {problem.get('detail') or problem.get('title') or ''}".strip()
                if not idempotent and status not in RETRIED_STATUSES:
                    raise Unavailable(
                        f"{what}: {self.shown_url} failed ({reason}); it may have been done: "
                        "look before you repeat it",
                        status=status,
                        problem=problem,
                    )
                pause_at_least = _retry_after(response) or 0.0
            attempt += 1
            cap = min(self.max_backoff, self.backoff * 2**attempt)
            pause = max(pause_at_least, random.uniform(0.0, cap))
            pause = min(pause, max(0.0, until - time.monotonic()))
            log.debug("%s failed (%s); attempt %d, next in %.2fs", what, reason, attempt, pause)
            time.sleep(pause)

    @staticmethod
    def _answer(response: httpx.Response) -> Answer:
        content = response.content
        body = jsonlib.loads(content) if content else None
        return Answer(status=response.status_code, body=body, server_time=_server_time(response))
