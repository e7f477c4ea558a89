"""What the client tests share: checkpoint bytes written where a job would write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.builders import file_entries, step_files


def write_step(
    tier_dir: Path, project: str, run: str, step: int, files: dict[str, bytes] | None = None
) -> Path:
    """Write a step's files where the service would place it on a local tier."""
    root = tier_dir / project / run / f"step-{step}"
    for name, data in (files or step_files(step)).items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root


def manifest_of(root: Path) -> list[dict[str, Any]]:
    """The manifest of every file under `root`, with sha256 checksums."""
    files = {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
    return file_entries(files)
