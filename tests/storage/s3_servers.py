"""Real S3 servers for the storage tests: moto's server and `rclone serve s3`.

Session-scoped, so each xdist worker starts its own on free ports. tests/conftest.py
registers this module as a plugin: every test can ask for `moto_s3` or `rclone_s3`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from tests.storage.ports import free_port, owns_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BIN = Path(sys.executable).parent
ACCESS_KEY = "ckpt-test-access-key"
SECRET_KEY = "ckpt-test-secret-7f3a9c"  # distinctive, so tests can prove it is never shown
START_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    url: str


def dummy_credentials() -> None:
    """Before any client exists, so boto3's default chain finds the test servers' keys (and
    never a developer's real ones: the tests must not reach a real account)."""
    os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True  # any HTTP answer (rclone's 403 to an unsigned request) means it is up
    except OSError:
        return False
    return True


def _start(command: list[str], url: str, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _answers(url) and owns_port(process.pid, int(url.rsplit(":", 1)[1])):
            return process
        time.sleep(0.05)
    _stop(process)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{command[0]} did not come up at {url}:\n{tail}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _serve(make_command: list[str], log_path: Path) -> Iterator[S3Endpoint]:
    """Start on a free port, trying another if one was taken between probe and bind."""
    for attempt in range(3):
        port = free_port()
        command = [part.replace("{port}", str(port)) for part in make_command]
        url = f"http://127.0.0.1:{port}"
        try:
            process = _start(command, url, log_path)
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        try:
            yield S3Endpoint(url)
        finally:
            _stop(process)
        return


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    dummy_credentials()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    yield from _serve([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", "{port}"], log_path)


@pytest.fixture(scope="session")
def rclone_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    dummy_credentials()
    base = tmp_path_factory.mktemp("rclone")
    root = base / "root"
    root.mkdir()
    command = [
        str(BIN / "rclone"),
        "serve",
        "s3",
        "--config",
        os.devnull,
        "--auth-key",
        f"{ACCESS_KEY},{SECRET_KEY}",
        "--addr",
        "127.0.0.1:{port}",
        str(root),
    ]
    yield from _serve(command, base / "rclone.log")


@pytest.fixture(params=["moto", "rclone"])
def either_s3(request: pytest.FixtureRequest) -> S3Endpoint:
    """Each S3 server in turn."""
    endpoint: S3Endpoint = request.getfixturevalue(f"{request.param}_s3")
    return endpoint


@functools.cache
def s3_client(endpoint: S3Endpoint) -> S3Client:
    """A plain client for arranging a test's objects, independent of the code under test."""
    dummy_credentials()
    config = Config(
        retries={"total_max_attempts": 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint.url, config=config)


def new_bucket(endpoint: S3Endpoint, prefix: str = "b") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:20]}".lower()
    s3_client(endpoint).create_bucket(Bucket=name)
    return name
