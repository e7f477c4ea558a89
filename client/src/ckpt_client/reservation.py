"""An asynchronous save's reservation: reserve the step, keep it alive, commit or abort.

The service gives a `writing` checkpoint a `reserved_until` and aborts it as abandoned once
that passes; a long save keeps it alive from a daemon thread, every KEEPALIVE_FRACTION of
the time the service granted (measured on the service's clock, from its `Date` header, so a
client whose clock is off neither lets it lapse nor hammers the service). A service that
gives no `reserved_until` has no such expiry, and no thread is started.

When the catalog cannot be reached at reserve time, the save goes on without a reservation
(`checkpoint` is None): the commit then registers the whole checkpoint, spooled if need be,
so an outage costs the catalog nothing but time. With `on_unavailable="raise"` reserve
raises instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ckpt_client.errors import CatalogError, Unavailable
from ckpt_client.models import Checkpoint
from ckpt_client.transport import Answer, segment

if TYPE_CHECKING:
    from ckpt_client.client import Client
    from ckpt_client.run import Run

log = logging.getLogger("ckpt_client")

KEEPALIVE_FRACTION = 0.25  # three more tries before the reservation lapses
KEEPALIVE_MIN = 0.2  # seconds, whatever the service grants
REASON_LIMIT = 500


def keepalive_interval(reserved_until: datetime, server_now: datetime | None) -> float:
    """Seconds until the next keepalive: a fraction of what is left of the reservation."""
    now = server_now or datetime.now(timezone.utc)
    left = (reserved_until - now).total_seconds()
    return max(KEEPALIVE_MIN, left * KEEPALIVE_FRACTION)


class Keepalive:
    """The daemon thread that keeps one reservation alive until stopped."""

    def __init__(self, client: Client, checkpoint: Checkpoint, interval: float) -> None:
        self._client = client
        self._checkpoint = checkpoint
        self._interval = interval
        self._stop = threading.Event()
        self.sent = 0
        self.lapsed: CatalogError | None = None  # why it stopped on its own
        self._thread = threading.Thread(
            target=self._loop, name=f"ckpt-keepalive-{checkpoint.id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop at once; a keepalive in flight finishes on its own (never waited for)."""
        self._stop.set()

    def _loop(self) -> None:
        interval = self._interval
        path = f"/v1/checkpoints/{segment(self._checkpoint.id)}/keepalive"
        while not self._stop.wait(interval):
            try:
                answer = self._client._request_now("POST", path, json=None, deadline=interval)
            except Unavailable as error:
                log.warning("keepalive of step %d failed: %s", self._checkpoint.step, error)
                interval = max(KEEPALIVE_MIN, interval / 2)  # sooner, while time is left
                continue
            except CatalogError as error:
                if not self._stop.is_set():  # a keepalive racing its own commit says nothing
                    self.lapsed = error
                    log.warning(
                        "the reservation of step %d (%s) is no longer kept alive: %s",
                        self._checkpoint.step,
                        self._checkpoint.id,
                        error,
                    )
                return
            except Exception as error:  # the client closed under it, say: end quietly
                if not self._stop.is_set():
                    log.warning("keepalive of step %d stopped: %r", self._checkpoint.step, error)
                return
            self.sent += 1
            until = Checkpoint.from_json(answer.body).reserved_until
            if until is None:
                return  # committed meanwhile: nothing left to keep alive
            interval = keepalive_interval(until, answer.server_time)


class Reservation:
    """A step reserved (`writing`) while its bytes are written; see the module's doc.

    Used as a context manager, a clean exit commits (with `metrics`) and an exception aborts
    and is re-raised. Outside one, call `commit()` or `abort()` yourself."""

    def __init__(
        self,
        run: Run,
        step: int,
        uri: str,
        *,
        cls: str,
        labels: Mapping[str, str] | None,
    ) -> None:
        self.run = run
        self.step = step
        self.uri = uri
        self.cls = cls
        self.labels = dict(labels or {})
        self.metrics: dict[str, float] = {}
        self.checkpoint: Checkpoint | None = None
        self.closed = False
        self._keepalive: Keepalive | None = None
        self._reserve()

    @property
    def _client(self) -> Client:
        return self.run.client

    def _body(self) -> dict[str, Any]:
        return {"step": self.step, "class": self.cls, "uri": self.uri, "labels": self.labels}

    def _reserve(self) -> None:
        path = f"/v1/runs/{segment(self.run.id)}/checkpoints"
        try:
            answer = self._client._call("POST", path, json={**self._body(), "committed": False})
        except Unavailable as error:
            if self._client.on_unavailable == "raise":
                raise
            log.warning(
                "the catalog is unreachable: step %d of %s/%s is saved unreserved and will be "
                "registered at its commit (%s)",
                self.step,
                self.run.project,
                self.run.name,
                error,
            )
            return
        self.checkpoint = Checkpoint.from_json(answer.body)
        self._watch(answer)

    def _watch(self, answer: Answer) -> None:
        checkpoint = self.checkpoint
        if checkpoint is None or checkpoint.state != "writing" or checkpoint.reserved_until is None:
            return
        interval = keepalive_interval(checkpoint.reserved_until, answer.server_time)
        self._keepalive = Keepalive(self._client, checkpoint, interval)

    @property
    def keepalives_sent(self) -> int:
        return self._keepalive.sent if self._keepalive is not None else 0

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.stop()

    def commit(
        self,
        files: Sequence[Mapping[str, Any]] | None = None,
        size_bytes: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> Checkpoint | None:
        """The bytes are down: the checkpoint becomes `active`. `metrics` merge into
        `self.metrics`, sent with the commit. Without `files` the service lists the uri for
        the manifest. Spooled past the deadline (returns None, logged); again after it is
        committed returns the same checkpoint."""
        if metrics:
            self.metrics.update({k: float(v) for k, v in metrics.items()})
        if self.closed:
            return self.checkpoint
        self._stop_keepalive()
        self.closed = True
        extra: dict[str, Any] = {}
        if files is not None:
            extra["files"] = [dict(f) for f in files]
        if size_bytes is not None:
            extra["size_bytes"] = size_bytes
        if self.metrics:
            extra["metrics"] = dict(self.metrics)
        if self.checkpoint is None:  # never reserved: register it whole
            answer = self._client._spooled(
                "register",
                "POST",
                f"/v1/runs/{segment(self.run.id)}/checkpoints",
                {**self._body(), **extra},
                self.run._describe(self.step),
            )
        else:
            answer = self._client._spooled(
                "commit",
                "POST",
                f"/v1/checkpoints/{segment(self.checkpoint.id)}/commit",
                extra,
                f"commit of {self.run._describe(self.step)} ({self.checkpoint.id})",
            )
        if answer is not None:
            self.checkpoint = Checkpoint.from_json(answer.body)
            return self.checkpoint
        return None

    def abort(self, reason: str | None = None) -> Checkpoint | None:
        """The save failed: the reservation becomes `trashed` (its partial bytes are purged
        after the trash period). Not spooled: an abort that cannot be sent is left to the
        service, which aborts a reservation nobody keeps alive."""
        self._stop_keepalive()
        if self.closed:
            return self.checkpoint
        self.closed = True
        if self.checkpoint is None:
            return None
        body = {"reason": reason[:REASON_LIMIT]} if reason else {}
        path = f"/v1/checkpoints/{segment(self.checkpoint.id)}/abort"
        answer = self._client._call("POST", path, json=body)
        self.checkpoint = Checkpoint.from_json(answer.body)
        return self.checkpoint

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None:
            if not self.closed:
                self.commit()
            return
        try:
            self.abort(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        except (CatalogError, OSError) as failure:
            # The save's own error matters more; the service abandons the reservation anyway.
            log.warning("could not abort the reservation of step %d: %s", self.step, failure)
        # returning None re-raises `error`

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        ident = self.checkpoint.id if self.checkpoint is not None else "unreserved"
        return f"Reservation(step={self.step}, checkpoint={ident}, {state})"
