"""An import's local listing runs in a process of its own, which hands the tree over through
a pipe (app.services.lifecycle.import_scan). Stopped and continued while the pipe is full
(job control, a frozen container, a debugger), its writes return short; the tree must
still arrive whole, every checkpoint once. Stopped for good, it is given up."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.services.lifecycle import import_scan
from app.services.lifecycle.import_scan import ListingSilent, ScanJob, Stretch, scan_in_child

CHECKPOINTS = 3000


def test_a_listing_process_stopped_and_continued_hands_its_tree_over_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = set()
    for run in range(3):
        directory = tmp_path / "tree" / f"run-{run}" / "checkpoints"
        directory.mkdir(parents=True)
        for n in range(CHECKPOINTS // 3):
            name = f"epoch=0-step={n}.ckpt"
            (directory / name).write_bytes(b"w" * (n % 97))
            expected.add(f"run-{run}/checkpoints/{name}")
    # a pipe of one page and stretches of 50: the listing process waits on a full pipe
    # most of the time, where a stop cuts its writes short
    monkeypatch.setattr(import_scan, "PIPE_BYTES", 4096)
    monkeypatch.setattr(import_scan, "BATCH", 50)
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", spawn)  # as import_scan starts its child
    done = threading.Event()
    stops = 0

    def stop_and_continue() -> None:
        nonlocal stops
        while not started:
            time.sleep(0.001)
        while not done.is_set():
            try:
                os.kill(started[0].pid, signal.SIGSTOP)
                time.sleep(0.001)
                os.kill(started[0].pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            stops += 1
            time.sleep(0.001)

    job = ScanJob(f"file://{tmp_path}/tree", "tree", "auto", None, None, str(tmp_path))
    found: list[str] = []
    listed = 0
    harasser = threading.Thread(target=stop_and_continue)
    harasser.start()
    try:
        with scan_in_child(job) as pieces:
            for piece in pieces:
                if isinstance(piece, Stretch):
                    found.extend(candidate.key for candidate in piece.batch)
                    listed += piece.listed
                time.sleep(0.003)  # a writer slower than the listing: the pipe fills
    finally:
        done.set()
        harasser.join()
    assert stops > 10  # the listing process was stopped while it worked
    assert sorted(found) == sorted(expected)  # every checkpoint, once
    assert listed == CHECKPOINTS


def test_a_listing_process_stopped_for_good_is_given_up_and_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped and never continued, the listing process sends nothing: the import's wait
    for it ends after its patience with an error that says so, and the process is gone."""
    directory = tmp_path / "tree" / "run-0" / "checkpoints"
    directory.mkdir(parents=True)
    (directory / "epoch=0-step=1.ckpt").write_bytes(b"w")
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def spawn_stopped(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))
        os.kill(started[-1].pid, signal.SIGSTOP)  # before it has listed a thing
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", spawn_stopped)
    job = ScanJob(f"file://{tmp_path}/tree", "tree", "auto", None, None, str(tmp_path))
    waited = time.monotonic()
    with (
        pytest.raises(ListingSilent, match=r"sent nothing for 0\.5 s") as raised,
        scan_in_child(job, patience=0.5) as pieces,
    ):
        list(pieces)
    waited = time.monotonic() - waited
    assert "import the tree again" in str(raised.value)
    assert 0.5 <= waited < 30  # its patience, not for ever
    assert started[0].poll() == -signal.SIGKILL  # killed while stopped, and reaped
