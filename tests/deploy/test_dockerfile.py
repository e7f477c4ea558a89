"""The Dockerfile, checked without a Docker engine: hadolint (from PyPI) finds nothing, the
structure is what the image promises (multi-stage, slim, non-root, `ckpt` entrypoint), and
the HEALTHCHECK command is run for real against a live `ckpt api`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main

from app.cli import cli
from app.db import migrate
from tests.deploy.support import (
    REPO,
    Instruction,
    dev_tool,
    dockerfile_stages,
    image_env,
    pod_spec,
    render,
    unknown_settings,
)
from tests.storage.ports import free_port

COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|build-essential|make|apt-get|apk|dnf|yum)\b")
SERVICE_UID = 10001


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return dockerfile_stages()


def arguments(stage: list[Instruction], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


def exec_form(stage: list[Instruction], keyword: str) -> list[str]:
    """The JSON array of the stage's last ENTRYPOINT, CMD or HEALTHCHECK ... CMD."""
    (*_, last) = arguments(stage, keyword)
    parsed: list[str] = json.loads(last[last.index("[") :])
    return parsed


def test_hadolint_finds_nothing() -> None:
    result = dev_tool("hadolint", "--no-color", "Dockerfile")
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_multi_stage_on_a_slim_python(stages: list[list[Instruction]]) -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert base and re.fullmatch(r"python:3\.1[1-9]-slim-\w+", base[1]), base
    build, final = stages[0], stages[-1]
    assert len(stages) == 2
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")  # the venv links to the same Python


def test_final_stage_has_no_build_tools(stages: list[list[Instruction]]) -> None:
    """The slim base ships no compiler, and the final stage installs nothing: everything it
    has is copied from the build stage."""
    final = stages[-1]
    for command in arguments(final, "RUN"):
        assert not COMPILERS.search(command), command
        assert "pip install" not in command, command
    copies = arguments(final, "COPY") + arguments(final, "ADD")
    assert copies and all(c.startswith("--from=build ") for c in copies), copies


def test_runs_as_a_fixed_non_root_user(stages: list[list[Instruction]]) -> None:
    final = stages[-1]
    (*_, user) = arguments(final, "USER")
    assert user == f"{SERVICE_UID}:{SERVICE_UID}"  # numeric: runAsNonRoot can check it
    (created,) = [c for c in arguments(final, "RUN") if "useradd" in c]
    assert f"--uid {SERVICE_UID}" in created and "--gid" in created
    # ...and the Kubernetes pods run as that same user.
    for doc in render(REPO / "deploy/base"):
        spec = pod_spec(doc)
        if spec is not None:
            context = spec["securityContext"]
            assert context["runAsNonRoot"] is True, doc["metadata"]["name"]
            assert context["runAsUser"] == SERVICE_UID, doc["metadata"]["name"]


def test_entrypoint_is_the_ckpt_command(stages: list[list[Instruction]]) -> None:
    final = stages[-1]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form(final, "ENTRYPOINT") == ["ckpt"] and scripts["ckpt"] == "app.cli:main"
    (command,) = exec_form(final, "CMD")
    assert command in typer.main.get_command(cli).commands  # type: ignore[attr-defined]
    assert unknown_settings(image_env()) == []
    assert image_env()["CKPT_HOST"] == "0.0.0.0"  # reachable from outside the container


def test_image_keeps_the_migrations_beside_the_package(stages: list[list[Instruction]]) -> None:
    """`ckpt migrate` finds migrations/ next to app/ (app/db/migrate.py): the build copies
    both into one tree and installs it in place (editable), and the final stage keeps it."""
    assert migrate.MIGRATIONS_DIR == REPO / "migrations"
    build, final = stages[0], stages[-1]
    copies = arguments(build, "COPY")
    assert {"app ./app", "migrations ./migrations", "policies ./policies"} <= set(copies)
    assert any("--editable ." in command for command in arguments(build, "RUN"))
    (workdir,) = arguments(build, "WORKDIR")
    assert f"--from=build {workdir} {workdir}" in arguments(final, "COPY")
    assert image_env()["CKPT_POLICIES_DIR"] == f"{workdir}/policies"


def test_dockerignore_lets_in_only_what_the_build_copies(stages: list[list[Instruction]]) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"  # everything else stays out: .venv, .git, var/, a .env file
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for allowed_path in allowed:
        assert (REPO / allowed_path).exists(), allowed_path
    for copy in arguments(stages[0], "COPY"):
        *sources, _ = shlex.split(copy)
        for source in sources:
            assert any(source == a or source.startswith(a + "/") for a in allowed), source
    for secret_or_bulky in (".env", ".venv", ".git", "var", "tests"):
        assert not any(secret_or_bulky == a.split("/")[0] for a in allowed), secret_or_bulky


# --- the HEALTHCHECK, run against a live API ---------------------------------------------------


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[int]:
    """`ckpt api` on a free loopback port, access control on, SQLite."""
    port = free_port()
    env = {
        **os.environ,
        "CKPT_DATABASE_URL": f"sqlite:///{tmp_path / 'ckpt.db'}",
        "CKPT_DATA_DIR": str(tmp_path / "data"),
        "CKPT_POLICIES_DIR": str(REPO / "policies"),
        "CKPT_TIERS_FILE": "",
        "CKPT_AUTH": "on",
        "CKPT_HOST": "127.0.0.1",
        "CKPT_PORT": str(port),
    }
    ckpt = Path(sys.executable).parent / "ckpt"
    with open(tmp_path / "api.log", "wb") as log:
        process = subprocess.Popen(
            [str(ckpt), "api"], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/healthz"):
            assert process.poll() is None, (tmp_path / "api.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "ckpt api did not come up in 30 s"
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=15)


def run_healthcheck(command: list[str], port: int) -> int:
    program, *args = command
    assert program == "python"  # the image's interpreter; here, this one
    env = {**os.environ, "CKPT_PORT": str(port)}
    return subprocess.run([sys.executable, *args], env=env, timeout=30, check=False).returncode


def test_healthcheck_passes_on_a_live_api_and_fails_without_one(
    stages: list[list[Instruction]], live_api: int
) -> None:
    (healthcheck,) = arguments(stages[-1], "HEALTHCHECK")
    assert "/healthz" in healthcheck
    command = exec_form(stages[-1], "HEALTHCHECK")
    assert run_healthcheck(command, live_api) == 0  # no token needed, with auth on
    assert run_healthcheck(command, free_port()) != 0
