"""A training run: what a job registers its checkpoints under, and ends."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ckpt_client.models import Checkpoint, format_time, parse_time, to_uri
from ckpt_client.reservation import Reservation
from ckpt_client.staging import stage
from ckpt_client.transport import segment

if TYPE_CHECKING:
    from ckpt_client.client import Client

log = logging.getLogger("ckpt_client")


class Run:
    """A run of the catalog, attached through a `Client` (`client.run(project, name)`).

    `id`, `project`, `name`, `status`, `labels`, `policy`, `resumed_from`, `started_at`
    and `ended_at` are as the service last answered (`refresh()` reads them again)."""

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self.client = client
        self._update(data)

    def _update(self, data: dict[str, Any]) -> None:
        self.id: str = str(data["id"])
        self.project: str = str(data["project"])
        self.name: str = str(data["name"])
        self.status: str = str(data["status"])
        self.labels: dict[str, str] = dict(data.get("labels") or {})
        self.policy: str | None = data.get("policy")
        self.resumed_from: str | None = data.get("resumed_from")
        started, ended = data.get("started_at"), data.get("ended_at")
        self.started_at: datetime | None = parse_time(started) if started else None
        self.ended_at: datetime | None = parse_time(ended) if ended else None

    def __repr__(self) -> str:
        return (
            f"Run(id={self.id!r}, project={self.project!r}, name={self.name!r}, "
            f"status={self.status!r})"
        )

    def _describe(self, step: int) -> str:
        return f"step {step} of {self.project}/{self.name}"

    @property
    def _path(self) -> str:
        return f"/v1/runs/{segment(self.id)}"

    def refresh(self) -> Run:
        """Read the run again from the service; returns itself."""
        self._update(self.client._call("GET", self._path).body)
        return self

    def register(
        self,
        step: int,
        uri: str | os.PathLike[str],
        *,
        cls: str = "rolling",
        files: Sequence[Mapping[str, Any]] | None = None,
        size_bytes: int | None = None,
        metrics: Mapping[str, float] | None = None,
        labels: Mapping[str, str] | None = None,
        created_at: datetime | None = None,
    ) -> Checkpoint | None:
        """Register a checkpoint whose bytes are written, under a tier's url (a local
        path is taken as its `file://` uri). Without `files` the service lists the uri for
        the manifest. Registering the same step with the same content again returns the
        same checkpoint; other content raises `Conflict`.

        Returns None when the catalog stayed unreachable past the deadline: the
        registration is then spooled (a warning names the file) and sent, in order and
        with the time it was made as `created_at`, by the next call that reaches the
        service or by `python -m ckpt_client flush`."""
        body: dict[str, Any] = {"step": step, "class": cls, "uri": to_uri(uri)}
        if files is not None:
            body["files"] = [dict(f) for f in files]
        if size_bytes is not None:
            body["size_bytes"] = size_bytes
        if metrics:
            body["metrics"] = {k: float(v) for k, v in metrics.items()}
        if labels:
            body["labels"] = dict(labels)
        if created_at is not None:
            body["created_at"] = format_time(created_at)
        answer = self.client._spooled(
            "register", "POST", f"{self._path}/checkpoints", body, self._describe(step)
        )
        return None if answer is None else Checkpoint.from_json(answer.body)

    def reserve(
        self,
        step: int,
        uri: str | os.PathLike[str],
        *,
        cls: str = "rolling",
        labels: Mapping[str, str] | None = None,
    ) -> Reservation:
        """Reserve `step` before an asynchronous save writes it (`committed: false`): the
        checkpoint is `writing`, kept alive from a thread while the reservation is open.
        Use it as a context manager: a clean exit commits with `pending.metrics`, an
        exception aborts and propagates. See `Reservation`."""
        return Reservation(self, step, to_uri(uri), cls=cls, labels=labels)

    def checkpoints(self, cls: str | None = None, state: str | None = None) -> Iterator[Checkpoint]:
        """The run's checkpoints, newest step first, every state (deleted ones too) unless
        `state` says which; pages are fetched as the iteration needs them."""
        params: dict[str, Any] = {}
        if cls is not None:
            params["class"] = cls
        if state is not None:
            params["state"] = state
        for item in self.client._pages(f"{self._path}/checkpoints", params):
            yield Checkpoint.from_json(item)

    def latest(self) -> Checkpoint | None:
        """The newest active checkpoint, as it is (nothing staged)."""
        query = {"state": "active", "limit": 1}
        items = self.client._call("GET", f"{self._path}/checkpoints", params=query).body["items"]
        return Checkpoint.from_json(items[0]) if items else None

    def resume_point(
        self, *, stage_to: str | None = None, wait: bool = True, timeout: float | None = None
    ) -> Checkpoint | None:
        """The checkpoint to resume from: the newest active one, or None if the run has
        none. With `stage_to`, a checkpoint with no copy on that tier is restored onto it
        first (the service's restore action, a provider's archive restore included) and,
        with `wait`, returned once the copy is there, logging a line per poll at INFO.
        Raises `RestoreFailed` if the restore fails, `TimeoutError` after `timeout` s.
        The copy on the tier is `checkpoint.location(stage_to)`."""
        latest = self.latest()
        if latest is None or stage_to is None:
            return latest
        return stage(self.client, latest, stage_to, wait=wait, timeout=timeout)

    def complete(self, ended_at: datetime | None = None) -> None:
        """Mark the run `completed` (at `ended_at`, else now). Spooled past the deadline."""
        self._end("completed", ended_at)

    def fail(self, ended_at: datetime | None = None) -> None:
        """Mark the run `failed` (at `ended_at`, else now). Spooled past the deadline."""
        self._end("failed", ended_at)

    def _end(self, status: str, ended_at: datetime | None) -> None:
        body: dict[str, Any] = {"status": status}
        if ended_at is not None:
            body["ended_at"] = format_time(ended_at)
        what = f"end ({status}) of run {self.project}/{self.name}"
        answer = self.client._spooled("end", "PATCH", self._path, body, what)
        if answer is not None:
            self._update(answer.body)
        else:
            self.status = status  # as it will be once the spool is replayed
