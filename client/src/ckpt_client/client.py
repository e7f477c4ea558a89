"""The entry point: a connection to one catalog service, configured like the service's
own tools, from the environment (`CKPT_URL`, `CKPT_TOKEN`, `CKPT_SPOOL_DIR`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from ckpt_client.errors import Unavailable
from ckpt_client.models import Checkpoint, Tier, format_time
from ckpt_client.run import Run
from ckpt_client.spool import Entry, ReplayReport, Spool
from ckpt_client.staging import stage
from ckpt_client.transport import Answer, Transport, redact, segment

log = logging.getLogger("ckpt_client")

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_SPOOL_DIR = "~/.cache/ckpt/spool"
DEFAULT_TIMEOUT = 30.0  # one HTTP attempt
DEFAULT_DEADLINE = 60.0  # one call, retries included
PAGE = 500

OnUnavailable = Literal["spool", "raise"]


class Client:
    """A connection to the catalog.

    `url`, `token` and `spool_dir` default to `CKPT_URL` (else http://127.0.0.1:8000),
    `CKPT_TOKEN` (else none: a service with `CKPT_AUTH=off`) and `CKPT_SPOOL_DIR` (else
    ~/.cache/ckpt/spool). `timeout` bounds one HTTP attempt, `deadline` one call with its
    retries (connection errors, 429, 5xx; every call is idempotent on the service).

    Past the deadline, registrations, commits and run ends are spooled to disk and replayed
    later, in order (see `ckpt_client.spool`), instead of raising; `on_unavailable="raise"`
    raises `Unavailable` instead and leaves the spool alone. Thread-safe.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        spool_dir: str | os.PathLike[str] | None = None,
        deadline: float = DEFAULT_DEADLINE,
        on_unavailable: OnUnavailable = "spool",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url = (url or os.environ.get("CKPT_URL") or DEFAULT_URL).rstrip("/")
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"the catalog url must be http:// or https://, not {redact(url)!r}")
        if on_unavailable not in ("spool", "raise"):
            raise ValueError(f"on_unavailable must be 'spool' or 'raise', not {on_unavailable!r}")
        if timeout <= 0 or deadline <= 0:
            raise ValueError("timeout and deadline must be positive numbers of seconds")
        # token="" says "no token" even where CKPT_TOKEN is set
        token = (token if token is not None else os.environ.get("CKPT_TOKEN")) or None
        directory = spool_dir or os.environ.get("CKPT_SPOOL_DIR") or DEFAULT_SPOOL_DIR
        self.url = url
        self.deadline = deadline
        self.page_size = PAGE  # items per page when a listing is followed
        self.on_unavailable: OnUnavailable = on_unavailable
        self.spool = Spool(Path(directory).expanduser(), url)
        self._authenticated = token is not None
        self._transport = Transport(
            url, token=token, timeout=timeout, deadline=deadline, http_transport=transport
        )
        # Whether the spool may hold entries of ours: looked at once, then known.
        self._spool_unknown = on_unavailable == "spool"

    def __repr__(self) -> str:  # never the token
        token = "<token>" if self._authenticated else "None"
        spool = str(self.spool.directory)
        return f"Client(url={redact(self.url)!r}, token={token}, spool_dir={spool!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (the spool stays on disk)."""
        self._transport.close()

    # --- runs and checkpoints ----------------------------------------------------------------

    def run(
        self,
        project: str,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        policy: str | None = None,
        resumed_from: str | Checkpoint | None = None,
        started_at: datetime | None = None,
    ) -> Run:
        """Create the run, or attach to it if it exists (a restarted job calls this again:
        the service answers 200 with the run as it is, its labels untouched).

        Not spooled: a job that cannot reach the catalog when it starts gets `Unavailable`
        after the deadline, before it has written anything the catalog would miss.
        `started_at` back-dates a new run (an adopted or simulated one); now if left out."""
        body: dict[str, Any] = {"project": project, "name": name, "labels": dict(labels or {})}
        if policy is not None:
            body["policy"] = policy
        if resumed_from is not None:
            body["resumed_from"] = (
                resumed_from.id if isinstance(resumed_from, Checkpoint) else resumed_from
            )
        if started_at is not None:
            body["started_at"] = format_time(started_at)
        return Run(self, self._call("POST", "/v1/runs", json=body).body)

    def get_run(self, run_id: str) -> Run:
        """A run by its id (`NotFound` if there is none)."""
        return Run(self, self._call("GET", f"/v1/runs/{segment(run_id)}").body)

    def find_run(self, project: str, name: str) -> Run | None:
        """The run `name` of `project`, or None; creates nothing (the API lists runs by
        project, so this pages through the project's runs)."""
        for item in self._pages("/v1/runs", {"project": project}):
            if item.get("name") == name:
                return Run(self, item)
        return None

    def checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """One checkpoint with its locations (`NotFound` if the id names none)."""
        answer = self._call("GET", f"/v1/checkpoints/{segment(checkpoint_id)}")
        return Checkpoint.from_json(answer.body)

    def update_checkpoint(
        self,
        checkpoint_id: str,
        *,
        cls: str | None = None,
        labels: Mapping[str, str | None] | None = None,
        metrics: Mapping[str, float | None] | None = None,
    ) -> Checkpoint:
        """Re-class a checkpoint (promote the last save to `final`, a good one to
        `milestone`) and merge labels and metrics into its own (a key given None is
        removed); the service audits it and re-evaluates the run. Only the arguments
        given are sent. Not spooled: `Unavailable` past the deadline."""
        body: dict[str, Any] = {}
        if cls is not None:
            body["class"] = cls
        if labels is not None:
            body["labels"] = dict(labels)
        if metrics is not None:
            body["metrics"] = {k: None if v is None else float(v) for k, v in metrics.items()}
        answer = self._call("PATCH", f"/v1/checkpoints/{segment(checkpoint_id)}", json=body)
        return Checkpoint.from_json(answer.body)

    def restore(
        self,
        checkpoint_id: str,
        tier: str,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> Checkpoint:
        """Stage a copy of the checkpoint onto `tier` and (with `wait`) return it once the
        copy is there; a no-op when it already has a location on `tier`. The service's
        restore action does the work, including a provider's archive restore first; this
        only asks and waits, logging a line per poll. Raises `RestoreFailed` if the action
        fails and `TimeoutError` after `timeout` seconds (None: no limit)."""
        return stage(self, self.checkpoint(checkpoint_id), tier, wait=wait, timeout=timeout)

    def tiers(self) -> list[Tier]:
        """The service's tiers, hottest first: where a job may write its checkpoints."""
        return [Tier.from_json(item) for item in self._pages("/v1/tiers", {})]

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """Any endpoint of the API that has no method here (plans, sweeps, the ledger), with
        the same retries and errors: the answer's JSON body (None when empty)."""
        query = dict(params) if params is not None else None
        return self._call(method.upper(), path, json=json, params=query).body

    def flush(self, *, deadline: float | None = None) -> ReplayReport:
        """Replay this service's spooled calls now, oldest first, each within `deadline`
        seconds (the client's by default). What `python -m ckpt_client flush` does."""
        per_entry = self.deadline if deadline is None else deadline
        report = self.spool.replay(self._send_entry, until=None, per_entry=per_entry)
        self._spool_unknown = report.unreachable is not None or report.blocked
        return report

    # --- the calls beneath ----------------------------------------------------------------

    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every item of a list endpoint, following `next_cursor`."""
        cursor: str | None = None
        while True:
            query = {**params, "limit": self.page_size, **({"cursor": cursor} if cursor else {})}
            page = self._call("GET", path, params=query).body
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Answer:
        """A call that is never spooled. Spooled calls go first, within the same deadline,
        so that what the job does next follows what it did while the service was away."""
        until = self._transport.deadline_at(deadline)
        if self._spool_waiting():
            report = self._replay(until)
            if report.unreachable is not None:
                raise report.unreachable
        return self._transport.request(method, path, json=json, params=params, deadline_at=until)

    def _request_now(self, method: str, path: str, *, json: Any, deadline: float) -> Answer:
        """A call outside the job's order (a keepalive from its thread): no replay first."""
        until = self._transport.deadline_at(deadline)
        return self._transport.request(method, path, json=json, deadline_at=until)

    def _spooled(
        self, kind: str, method: str, path: str, body: dict[str, Any], what: str
    ) -> Answer | None:
        """A call that is spooled past its deadline: its answer, or None when it was
        spooled (logged as a warning naming the entry). A refusal raises as usual."""
        if self.on_unavailable == "raise":
            return self._transport.request(method, path, json=body)
        started = datetime.now(timezone.utc)
        until = self._transport.deadline_at()
        if not self._spool_waiting():
            try:
                return self._transport.request(method, path, json=body, deadline_at=until)
            except Unavailable as error:
                reason: Exception = error
                entry = self._keep(kind, method, path, _dated(kind, body, started), what, error)
                self._spool_unknown = True
        else:
            # Earlier calls wait in the spool: this one joins the end of the queue, so that
            # it cannot overtake them (a run end before its last registrations, say).
            entry = self._keep(kind, method, path, _dated(kind, body, started), what, None)
            report = self._replay(until, own=entry)
            if report.own_landed:
                answer: Answer = report.own_answer
                return answer
            if report.own_error is not None:
                raise report.own_error
            reason = report.unreachable or Unavailable("another process is replaying the spool")
        log.warning(
            "the catalog is unreachable: %s spooled to %s, to be sent when it is back (%s)",
            what,
            entry,
            reason,
        )
        return None

    def _keep(
        self,
        kind: str,
        method: str,
        path: str,
        body: dict[str, Any],
        what: str,
        unreachable: Unavailable | None,
    ) -> Path:
        """Spool one call; a spool that cannot be written (a read-only home, a full disk)
        leaves nothing to replay, so the call raises `Unavailable` after all."""
        try:
            return self.spool.add(kind, method, path, body, what)
        except OSError as error:
            log.error("cannot spool %s to %s: %s", what, self.spool.directory, error)
            raise Unavailable(
                f"{what}: the catalog is unreachable and the spool cannot be written ({error})",
                status=unreachable.status if unreachable else None,
                problem=unreachable.problem if unreachable else None,
            ) from (unreachable or error)

    def _spool_waiting(self) -> bool:
        """Whether spooled calls of this service may be waiting (one directory listing the
        first time, then known: this client spools, and a replay empties)."""
        if self._spool_unknown and not self.spool.pending():
            self._spool_unknown = False
        return self._spool_unknown

    def _replay(self, until: float, own: Path | None = None) -> ReplayReport:
        report = self.spool.replay(self._send_entry, until=until, per_entry=self.deadline, own=own)
        self._spool_unknown = report.unreachable is not None or report.blocked
        if report.landed:
            log.info("%d spooled calls reached the catalog", report.landed)
        return report

    def _send_entry(self, entry: Entry, until: float) -> Answer:
        return self._transport.request(
            entry.method, entry.target, json=entry.body, deadline_at=until
        )


def _dated(kind: str, body: dict[str, Any], at: datetime) -> dict[str, Any]:
    """A spooled call keeps the time it was made, not the time it is replayed: a
    registration its `created_at` (policies count ages from it), a run end its `ended_at`."""
    field = {"register": "created_at", "end": "ended_at"}.get(kind)
    if field is None or body.get(field) is not None:
        return body
    return {**body, field: format_time(at)}
