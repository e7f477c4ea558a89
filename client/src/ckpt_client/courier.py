"""The thread a training integration sends its catalog calls from.

A save must not wait on the service: a reservation and a commit are round trips of
several milliseconds (seconds, past a deadline, when the service is away), which is more
than 1 % of a 100 MB save. So each integration hands its calls to a `Courier`, which
makes them one at a time, in the order they were handed over (a commit never overtakes
its reservation, a run's end never overtakes its last save), on one daemon thread started
at the first call. `drain` waits for what was handed over so far (at the end of a fit,
before the last save is promoted); the interpreter's exit drains it too, so a training
that raised still has its saves catalogued (or spooled).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, TypeVar

log = logging.getLogger("ckpt_client")

T = TypeVar("T")


class Courier:
    """One thread making the calls it is handed, in order; see the module's doc."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """Make `call` after those handed over before it; its future has its result. An
        exception it raises is logged (and set on the future), never lost."""
        future: Future[T] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
                atexit.register(self.close)  # atexit runs before daemon threads stop
            self._tasks.put((future, call))
        return future

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the calls handed over so far are made; False if `timeout` came first."""
        if self._thread is None:
            return True
        done, _ = wait([self.submit(lambda: None)], timeout=timeout)
        return bool(done)

    def close(self) -> None:
        """Make the calls still to make, then end the thread (a later submit starts another)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._tasks.put(None)
        if thread is not None:
            atexit.unregister(self.close)
            if thread is not threading.current_thread():
                thread.join()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, call = task
            try:
                future.set_result(call())
            except BaseException as error:  # a bug here must not cost the later calls
                log.exception("a catalog call on %s failed", self.name)
                future.set_exception(error)
