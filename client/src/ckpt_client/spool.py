"""Calls written to disk while the catalog is unreachable, replayed in order later.

One JSON file per call, fsync'd (file and directory) before the call returns, so a job
killed right after a spooled registration still has it on disk. Names start with the
time in nanoseconds, zero-padded, then the pid and a per-process sequence: sorting the
names sorts the calls as they were made, across every process sharing the directory.
A short digest of the service's url is in the name too, so one spool serves several
services and each entry goes only where it was meant for.

Never on disk: the token. A replay sends the replaying client's own.

Replay holds an exclusive lock (`flock` on `.lock`, plus a thread lock) so that two
replayers cannot interleave and reorder one run's calls. An entry the service refuses
(4xx) is moved to `failed/` with the refusal, logged, and never retried: it would be
refused again forever. An entry still unreachable stays, and so do all after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ckpt_client.errors import CatalogError, Unavailable
from ckpt_client.models import format_time

try:  # POSIX; elsewhere the thread lock alone orders one process's replays
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("ckpt_client")

FORMAT = 1
LOCK_POLL = 0.05


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover - a directory cannot be opened elsewhere
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(target: Path, data: dict[str, Any]) -> None:
    """Write `data` to `target` all or nothing: a temporary name (skipped by readers),
    fsync, rename, fsync of the directory."""
    temporary = target.with_name(f".tmp-{target.name}")
    with open(temporary, "w", encoding="utf-8") as sink:
        json.dump(data, sink, sort_keys=True)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temporary, target)
    _fsync_dir(target.parent)


def format_time_now() -> str:
    return format_time(datetime.now(timezone.utc))


@dataclass(frozen=True)
class Entry:
    """One spooled call: what to send, and a sentence saying what it is for the logs."""

    path: Path
    kind: str  # register | commit | end
    method: str
    target: str
    body: dict[str, Any]
    what: str


@dataclass
class ReplayReport:
    """What a replay did. `unreachable` is set when it stopped because the service could
    not be reached; `blocked` when another replayer held the lock until the deadline."""

    landed: int = 0
    refused: list[tuple[Path, CatalogError]] = field(default_factory=list)
    unreachable: Unavailable | None = None
    blocked: bool = False
    own_answer: Any = None
    own_landed: bool = False
    own_error: CatalogError | None = None


Send = Callable[[Entry, float], Any]


class Spool:
    """The spool directory of one service (entries of other services are left alone)."""

    def __init__(self, directory: Path, service_url: str) -> None:
        self.directory = directory
        self.service_url = service_url
        self.key = hashlib.sha256(service_url.encode()).hexdigest()[:10]
        self._sequence = 0
        self._last_ns = 0
        self._names = threading.Lock()
        self._replaying = threading.Lock()

    @property
    def failed_dir(self) -> Path:
        return self.directory / "failed"

    def add(self, kind: str, method: str, target: str, body: dict[str, Any], what: str) -> Path:
        """Write one call durably and return its file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._names:
            # Strictly increasing within the process even if the wall clock steps back.
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            self._sequence += 1
            name = f"{self._last_ns:020d}-{os.getpid()}-{self._sequence:06d}-{self.key}-{kind}"
        path = self.directory / f"{name}.json"
        _write_durably(
            path,
            {
                "format": FORMAT,
                "service": self.service_url,
                "kind": kind,
                "method": method,
                "target": target,
                "body": body,
                "what": what,
                "spooled_at": format_time_now(),
            },
        )
        return path

    def pending(self) -> list[Path]:
        """This service's entries, oldest first."""
        try:
            names = os.listdir(self.directory)
        except OSError:  # none yet (or not a directory: then nothing could be spooled)
            return []
        suffix = f"-{self.key}-"
        mine = [n for n in names if n.endswith(".json") and not n.startswith(".") and suffix in n]
        return [self.directory / n for n in sorted(mine)]

    def failed(self) -> list[Path]:
        try:
            names = os.listdir(self.failed_dir)
        except OSError:
            return []
        return [self.failed_dir / n for n in sorted(names) if n.endswith(".json")]

    @staticmethod
    def load(path: Path) -> Entry:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Entry(
            path=path,
            kind=str(data["kind"]),
            method=str(data["method"]),
            target=str(data["target"]),
            body=dict(data["body"]),
            what=str(data.get("what", data["target"])),
        )

    def discard(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _fsync_dir(path.parent)

    def set_aside(self, path: Path, error: CatalogError | Exception) -> Path:
        """Move a refused (or unreadable) entry to `failed/`, with why, and return it."""
        self.failed_dir.mkdir(parents=True, exist_ok=True)
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as unreadable:
            data = {"unreadable": str(unreadable)}
        data["refused"] = {
            "at": format_time_now(),
            "status": getattr(error, "status", None),
            "problem": getattr(error, "problem", None),
            "message": str(error),
        }
        target = self.failed_dir / path.name
        _write_durably(target, data)
        self.discard(path)
        return target

    @contextlib.contextmanager
    def lock(self, until: float | None) -> Iterator[bool]:
        """Hold the replay lock; yields False if it could not be had by `until` (a
        `time.monotonic()` value; None waits as long as it takes)."""
        timeout = -1.0 if until is None else max(0.0, until - time.monotonic())
        if not self._replaying.acquire(timeout=timeout):
            yield False
            return
        try:
            if fcntl is None:
                yield True
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / ".lock", "a+b") as handle:
                while True:
                    try:
                        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if until is not None and time.monotonic() >= until:
                            yield False
                            return
                        time.sleep(LOCK_POLL)
                try:
                    yield True
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        finally:
            self._replaying.release()

    def replay(
        self, send: Send, *, until: float | None, per_entry: float, own: Path | None = None
    ) -> ReplayReport:
        """Send every pending entry in order, each within `per_entry` seconds and all by
        `until` (None: no overall bound). Stops at the first unreachable one.

        `own` is the entry of the live call that triggered the replay: its answer (or its
        refusal, which the caller raises instead of setting it aside) is reported."""
        report = ReplayReport()
        with self.lock(until) as held:
            if not held:
                report.blocked = True
                return report
            seen: set[Path] = set()
            while True:  # again until empty: entries spooled meanwhile by other processes
                batch = [p for p in self.pending() if p not in seen]
                if not batch:
                    return report
                for path in batch:
                    seen.add(path)
                    if not self._replay_one(path, send, until, per_entry, own, report):
                        return report

    def _replay_one(
        self,
        path: Path,
        send: Send,
        until: float | None,
        per_entry: float,
        own: Path | None,
        report: ReplayReport,
    ) -> bool:
        """Replay one entry; False when the replay must stop here."""
        try:
            entry = self.load(path)
        except FileNotFoundError:
            return True  # replayed meanwhile by a process that did not hold our lock
        except (OSError, ValueError, KeyError, TypeError) as error:
            kept = self.set_aside(path, error)
            log.error("spooled call %s is unreadable (%s); moved to %s", path.name, error, kept)
            report.refused.append((kept, CatalogError(str(error))))
            return True
        deadline = time.monotonic() + per_entry
        if until is not None:
            deadline = min(deadline, until)
        try:
            answer = send(entry, deadline)
        except Unavailable as error:
            report.unreachable = error
            return False
        except CatalogError as error:
            if path == own:
                self.discard(path)
                report.own_error = error
                return True
            kept = self.set_aside(path, error)
            log.error(
                "the catalog refused the spooled %s (%s); kept in %s", entry.what, error, kept
            )
            report.refused.append((kept, error))
            return True
        self.discard(path)
        report.landed += 1
        if path == own:
            report.own_answer, report.own_landed = answer, True
        else:
            log.info("spooled %s landed", entry.what)
        return True
