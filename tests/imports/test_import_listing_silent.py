"""A local tree's listing process that stops answering (stopped for good, or stuck on a
file system that no longer answers) fails its import once the import's lease has lapsed,
saying why, rather than keeping the import `running` for ever; the tree can be imported
again."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.imports.trees import (
    catalog,
    finished,
    generic_tree,
    run_import,
    stamp,
    start_import,
    write_local,
)


def test_an_import_whose_listing_stops_for_good_fails_saying_so_and_can_run_again(
    app: FastAPI, client: TestClient, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hot = data_dir / "hot"
    write_local(hot / "legacy", generic_tree("exp1", [1, 2, 3]), mtime=stamp(2025, 3, 1))
    uri = f"file://{hot}/legacy"
    importer = app.state.runtime.imports
    usual = importer.lease
    importer.lease = timedelta(seconds=1)
    stopped: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = popen(*args, **kwargs)
        if "app.services.lifecycle.import_scan" in args[0]:
            os.kill(child.pid, signal.SIGSTOP)  # the listing process, stopped for good
            stopped.append(child)
        return child

    monkeypatch.setattr(subprocess, "Popen", spawn)
    started = start_import(client, uri=uri, project="adopt")
    failed = finished(app, client, started["id"])

    assert len(stopped) == 1
    assert failed["state"] == "failed", failed
    assert "the listing process sent nothing for 1 s" in failed["error"]
    assert failed["registered"] == 0
    assert catalog(client, "adopt") == {}
    assert stopped[0].poll() == -signal.SIGKILL  # not left behind, stopped

    monkeypatch.undo()
    importer.lease = usual
    again = run_import(app, client, uri=uri, project="adopt")
    assert again["state"] == "done", again
    assert again["registered"] == 3
    assert sorted(step for _, step in catalog(client, "adopt")) == [1, 2, 3]
