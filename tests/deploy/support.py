"""What the deployment tests share: where things are, and which variables the service reads."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from app.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parents[2]

# Every CKPT_* variable the service reads: one per Settings field (pydantic-settings prefix).
SETTINGS_VARIABLES = frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields)


def unknown_settings(names: Iterable[str]) -> list[str]:
    """The CKPT_* names among `names` that no setting reads: a typo there is silently ignored
    by the service, so a deployment would run on a default it meant to change."""
    return sorted({n for n in names if n.startswith(ENV_PREFIX)} - SETTINGS_VARIABLES)


Doc = dict[str, Any]
WORKLOADS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})


def render(kustomization: Path) -> list[Doc]:
    """Every document `kubectl kustomize` prints for a kustomization directory: the manifests
    exactly as `kubectl apply -k` would send them to a cluster."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: the Kubernetes tests render deploy/ with it"
    built = subprocess.run(
        [kubectl, "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, f"kubectl kustomize {kustomization}: {built.stderr}"
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def is_custom(doc: Doc) -> bool:
    """A custom resource: its API group has a dot and is not one of Kubernetes' own."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def pod_spec(doc: Doc) -> Doc | None:
    if doc["kind"] in WORKLOADS:
        spec: Doc = doc["spec"]["template"]["spec"]
        return spec
    return None


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
