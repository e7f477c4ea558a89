"""The courier the integrations send their catalog calls through: in order, off the
caller's thread, a failing call logged and never in the way of the next, drained on
demand and restartable after close."""

from __future__ import annotations

import functools
import logging
import threading

import pytest

from ckpt_client.courier import Courier


def test_calls_are_made_in_order_off_the_callers_thread() -> None:
    courier = Courier("test-courier")
    made: list[tuple[int, str]] = []

    def call(n: int) -> int:
        made.append((n, threading.current_thread().name))
        return n

    futures = [courier.submit(functools.partial(call, n)) for n in range(50)]
    assert courier.drain(timeout=10)
    assert [n for n, _ in made] == list(range(50))
    assert {name for _, name in made} == {"test-courier"}
    assert [f.result() for f in futures] == list(range(50))
    courier.close()


def test_a_failing_call_is_logged_and_the_next_ones_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    courier = Courier("test-courier")

    def boom() -> None:
        raise RuntimeError("refused")

    failed = courier.submit(boom)
    after = courier.submit(lambda: "still made")
    assert after.result(timeout=10) == "still made"
    with pytest.raises(RuntimeError, match="refused"):
        failed.result()
    assert any(
        "test-courier" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    )
    courier.close()


def test_drain_waits_for_a_slow_call_and_times_out_honestly() -> None:
    courier = Courier("test-courier")
    gate = threading.Event()
    courier.submit(gate.wait)
    assert not courier.drain(timeout=0.05)  # the call is still waiting on the gate
    gate.set()
    assert courier.drain(timeout=10)
    courier.close()


def test_close_makes_what_is_left_then_a_new_submit_starts_again() -> None:
    courier = Courier("test-courier")
    made: list[int] = []
    for n in range(5):
        courier.submit(functools.partial(made.append, n))
    courier.close()
    assert made == [0, 1, 2, 3, 4]
    assert courier.submit(lambda: 7).result(timeout=10) == 7
    courier.close()
    assert Courier("idle").drain(timeout=0)  # nothing handed over: nothing to wait for
