"""Client of the checkpoint lifecycle service, for training jobs.

    from ckpt_client import Client
    client = Client()                          # CKPT_URL, CKPT_TOKEN, CKPT_SPOOL_DIR
    run = client.run("llama", "run-42", labels={"team": "pretrain"})
    run.register(1000, "file:///mnt/ckpt/llama/run-42/step-1000", metrics={"eval_loss": 2.31})
    with run.reserve(2000, uri, cls="milestone") as pending:   # an asynchronous save
        save(...)
        pending.metrics["eval_loss"] = 2.1
    ckpt = run.resume_point(stage_to="hot")   # newest active checkpoint, staged onto hot
    run.complete()

Only `httpx` is needed: nothing of the service's own dependencies.
"""

from __future__ import annotations

from ckpt_client.client import Client
from ckpt_client.errors import (
    CatalogError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    RestoreFailed,
    Unauthorized,
    Unavailable,
)
from ckpt_client.models import Checkpoint, FileEntry, Location, Tier
from ckpt_client.reservation import Reservation
from ckpt_client.resume import resume_path
from ckpt_client.run import Run
from ckpt_client.spool import ReplayReport
from ckpt_client.transport import VERSION

__version__ = VERSION

__all__ = [
    "CatalogError",
    "Checkpoint",
    "Client",
    "Conflict",
    "FileEntry",
    "Forbidden",
    "Invalid",
    "Location",
    "NotFound",
    "ReplayReport",
    "Reservation",
    "RestoreFailed",
    "Run",
    "Tier",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "resume_path",
]
