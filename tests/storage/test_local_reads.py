"""A local tier reads only what lies inside it: a symlink (of the file, or of a directory
on its way) that leads out of the tier is refused, whatever the key says; one that stays
inside reads like any file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from app.storage.base import ObjectMissing, UnsafePath
from app.storage.local import LocalStorage


@pytest.fixture
def layout(tmp_path: Path) -> tuple[LocalStorage, Path]:
    tier, outside = tmp_path / "tier", tmp_path / "outside"
    (tier / "run" / "step_1").mkdir(parents=True)
    outside.mkdir()
    (tier / "run" / "step_1" / "trainer_state.json").write_text('{"global_step": 1}')
    (outside / "secret.json").write_text('{"token": "x"}')
    return LocalStorage(tier), outside


def test_a_file_inside_the_tier_reads_whole(layout: tuple[LocalStorage, Path]) -> None:
    storage, _ = layout
    assert storage.read_small("run/step_1/trainer_state.json", 1024) == b'{"global_step": 1}'


def test_a_file_symlink_leading_out_is_refused(layout: tuple[LocalStorage, Path]) -> None:
    storage, outside = layout
    (storage.root / "run" / "step_1" / "leak.json").symlink_to(outside / "secret.json")
    with pytest.raises(UnsafePath):
        storage.read_small("run/step_1/leak.json", 1024)
    with pytest.raises(UnsafePath):
        storage.open_read("run/step_1/leak.json")


def test_a_directory_symlink_on_the_way_out_is_refused(layout: tuple[LocalStorage, Path]) -> None:
    storage, outside = layout
    (storage.root / "run" / "elsewhere").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath):
        storage.read_small("run/elsewhere/secret.json", 1024)


def test_a_symlink_staying_inside_reads(layout: tuple[LocalStorage, Path]) -> None:
    storage, _ = layout
    (storage.root / "alias.json").symlink_to(storage.root / "run/step_1/trainer_state.json")
    assert storage.read_small("alias.json", 1024) == b'{"global_step": 1}'


def test_a_tier_reached_through_a_symlink_reads_its_files(tmp_path: Path) -> None:
    real = tmp_path / "real-tier"
    (real / "a").mkdir(parents=True)
    (real / "a" / "f.bin").write_bytes(b"abc")
    (tmp_path / "linked-tier").symlink_to(real, target_is_directory=True)
    storage = LocalStorage(tmp_path / "linked-tier")
    assert storage.read_small("a/f.bin", 10) == b"abc"


def test_a_missing_file_is_missing_not_unsafe(layout: tuple[LocalStorage, Path]) -> None:
    storage, _ = layout
    with pytest.raises(ObjectMissing):
        storage.open_read("run/step_1/nothing.json")


def test_a_fifo_outside_is_refused_without_hanging_the_read(
    layout: tuple[LocalStorage, Path],
) -> None:
    """A symlink to a named pipe outside the tier must not block the open until some
    writer comes: the read is refused at once. (A pipe inside the tier reads as a pipe:
    tests/integration/test_action_progress.py copies from one.)"""
    storage, outside = layout
    fifo = outside / "pipe"
    os.mkfifo(fifo)
    (storage.root / "run" / "step_1" / "state.json").symlink_to(fifo)
    failures: list[BaseException] = []

    def read() -> None:
        try:
            storage.read_small("run/step_1/state.json", 1024)
        except BaseException as error:  # handed to the test's thread
            failures.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # unblock it so the daemon thread can end, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("opening the pipe blocked")
    assert len(failures) == 1 and isinstance(failures[0], UnsafePath), failures


def test_a_directory_is_not_read_as_a_file(layout: tuple[LocalStorage, Path]) -> None:
    storage, _ = layout
    with pytest.raises(IsADirectoryError):
        storage.open_read("run/step_1")
