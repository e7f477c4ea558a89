"""The cyclic collector's pause around full plans: concurrent plans in one process share
it, and the collector comes back exactly when the last lets go, as it was before."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.services.lifecycle.snapshot import gc_paused, pause_gc


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_first_plan_to_finish_does_not_turn_the_collector_on_under_another() -> None:
    gc.enable()
    first, second = pause_gc(), pause_gc()
    assert not gc.isenabled()

    first()
    assert not gc.isenabled()  # the second plan still builds its million objects
    first()  # a release performed once, however often it is called
    assert not gc.isenabled()
    second()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_block_form_lets_go_when_its_block_fails() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("the plan failed")
    assert gc.isenabled()
