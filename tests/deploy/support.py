"""What the deployment tests share: where things are, and which variables the service reads."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from app.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parents[2]

# Every CKPT_* variable the service reads: one per Settings field (pydantic-settings prefix).
SETTINGS_VARIABLES = frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields)


def unknown_settings(names: Iterable[str]) -> list[str]:
    """The CKPT_* names among `names` that no setting reads: a typo there is silently ignored
    by the service, so a deployment would run on a default it meant to change."""
    return sorted({n for n in names if n.startswith(ENV_PREFIX)} - SETTINGS_VARIABLES)


def dev_tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a command-line tool installed with the dev dependencies (beside this Python)."""
    tool = Path(sys.executable).parent / name
    assert tool.exists(), f"{name} is missing: install the dev dependencies (pip install -e .[dev])"
    return subprocess.run(
        [str(tool), *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )


Instruction = tuple[str, str]  # ("RUN", "its arguments")


def dockerfile_stages(path: Path = REPO / "Dockerfile") -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage, each starting with its FROM;
    continuation lines joined, comments dropped."""
    lines = [
        line
        for line in path.read_text().replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    stages: list[list[Instruction]] = []
    for line in lines:
        keyword, _, arguments = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        if stages:  # an ARG before the first FROM belongs to no stage
            stages[-1].append((keyword.upper(), " ".join(arguments.split())))
    return stages


def image_env() -> dict[str, str]:
    """The ENV of the final stage: what every container of the image starts with."""
    env: dict[str, str] = {}
    for keyword, arguments in dockerfile_stages()[-1]:
        if keyword == "ENV":
            for pair in shlex.split(arguments):
                key, value = pair.split("=", 1)
                env[key] = value
    return env
