"""`pip install ./client` into a fresh virtual environment, as a training image would: it
brings httpx and what httpx needs, and none of the service's dependencies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.figures import FIGURES

CLIENT = Path(__file__).resolve().parents[2] / "client"
SERVER_ONLY = {"fastapi", "sqlalchemy", "boto3", "botocore", "google-cloud-storage", "pydantic"}
# httpx and its own dependencies (some only on older Pythons), and the environment's pip
ALLOWED = {
    "ckpt-client",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "idna",
    "certifi",
    "exceptiongroup",
    "typing-extensions",
    "pip",
    "setuptools",
}


def run(*command: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result
    return result


def interpreters() -> list[str]:
    """This one, and Python 3.10 (the oldest the client supports) when the machine has one
    that runs: a version manager's shim may run one only when it is selected, hence the
    second try with PYENV_VERSION."""
    found = [sys.executable]
    oldest = shutil.which("python3.10")
    if oldest is None:
        return found
    for extra in ({}, {"PYENV_VERSION": "3.10"}):
        probe = subprocess.run(
            [oldest, "-c", "import sys; print(sys.executable)"],
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            return [*found, probe.stdout.strip()]
    return found


@pytest.mark.parametrize("python", interpreters(), ids=lambda p: Path(p).name)
def test_the_client_installs_alone_into_a_fresh_environment(
    python: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    started = time.monotonic()
    venv = tmp_path / "venv"
    run(python, "-m", "venv", venv)
    fresh = venv / "bin" / "python"
    # pip's own cache serves what it downloaded before: only a first run reaches the index
    # a copy: a build in the work tree would leave its build/ there, and race another run's
    source = shutil.copytree(
        CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    run(fresh, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source)
    listed = run(fresh, "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}

    assert "ckpt-client" in installed and "httpx" in installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY
    assert installed <= ALLOWED, installed - ALLOWED
    probe = run(
        fresh,
        "-c",
        "import sys, ckpt_client; "
        "from ckpt_client import Client, resume_path, CatalogError; "
        "assert not {'fastapi', 'sqlalchemy', 'app'} & set(sys.modules), sorted(sys.modules); "
        "print(ckpt_client.__version__, ckpt_client.__file__)",
    )
    assert str(venv) in probe.stdout  # the installed copy, not the work tree's
    typed = Path(probe.stdout.split()[1]).parent / "py.typed"
    assert typed.is_file()
    flushed = run(
        fresh, "-m", "ckpt_client", "flush", "--spool-dir", tmp_path / "spool", timeout=60
    )
    assert "nothing spooled" in flushed.stdout
    checked = run(fresh, Path(__file__).with_name("fresh_probe.py"))
    assert "probe ok" in checked.stdout, checked
    took = time.monotonic() - started
    version = checked.stdout.split("(")[1].split(")")[0].replace(", ", ".")
    record_property(
        FIGURES, f"client: fresh venv (Python {version}), pip install ./client, probe: {took:.1f}s"
    )
