"""A local tier reads only what lies inside it: a symlink (of the file, or of a directory
on its way) that leads out of the tier is refused, whatever the key says; one that stays
inside reads like any file."""

from __future__ import annotations

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
