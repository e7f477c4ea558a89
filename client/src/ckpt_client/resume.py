"""`resume_path`: where a restarted job finds the checkpoint to resume from, in one call."""

from __future__ import annotations

from pathlib import Path

from ckpt_client.client import Client


def resume_path(
    project: str,
    run_name: str,
    *,
    stage_to: str | None = "hot",
    timeout: float | None = None,
    client: Client | None = None,
) -> Path | str | None:
    """The newest active checkpoint of the run `run_name` of `project`, staged onto
    `stage_to` first (see `Run.resume_point`): its local path when that copy is on a
    `file://` tier, else its uri; None when the run does not exist or has no active
    checkpoint. For `trainer.fit(ckpt_path=...)` or `resume_from_checkpoint=`.

    Creates nothing: the run is looked up, not attached. `client` defaults to a `Client()`
    configured from the environment (`CKPT_URL`, `CKPT_TOKEN`)."""
    own = client is None
    catalog = client if client is not None else Client()
    try:
        run = catalog.find_run(project, run_name)
        if run is None:
            return None
        checkpoint = run.resume_point(stage_to=stage_to, wait=True, timeout=timeout)
        if checkpoint is None:
            return None
        location = checkpoint.location(stage_to) if stage_to is not None else None
        uri = location.uri if location is not None else checkpoint.uri
        path = location.local_path if location is not None else checkpoint.local_path
        return path if path is not None else uri
    finally:
        if own:
            catalog.close()
