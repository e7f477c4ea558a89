"""`pip install ./client` into a fresh virtual environment, as a training image would: it
brings httpx and what httpx needs, and none of the service's dependencies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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


def test_the_client_installs_alone_into_a_fresh_environment(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    started = time.monotonic()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # pip's own cache serves what it downloaded before: only a first run reaches the index
    # a copy: a build in the work tree would leave its build/ there, and race another run's
    source = shutil.copytree(
        CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source)
    listed = run(python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}

    assert "ckpt-client" in installed and "httpx" in installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY
    assert installed <= ALLOWED, installed - ALLOWED
    probe = run(
        python,
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
        python, "-m", "ckpt_client", "flush", "--spool-dir", tmp_path / "spool", timeout=60
    )
    assert "nothing spooled" in flushed.stdout
    took = time.monotonic() - started
    record_property(FIGURES, f"client: fresh venv, pip install ./client and import: {took:.1f}s")
