"""torch.distributed.checkpoint (DCP) saves, catalogued: reserve, save, commit or abort.

    import torch.distributed.checkpoint as dcp
    import ckpt_client.dcp
    from ckpt_client import Client

    run = Client().run("llama", "run-42") if rank == 0 else None  # only rank 0 talks
    pending = None
    for step in ...:
        ...
        if step % 1000 == 0:
            if pending is not None:
                pending.result()                 # the previous save, committed
            pending = ckpt_client.dcp.async_save(
                {"app": AppState(model, optimizer)},   # a Stateful, or plain state dicts
                run=run, step=step, checkpoint_id=f"/mnt/ckpt/llama/run-42/step-{step}",
                metrics={"loss": loss},
                async_checkpointer_type=ckpt_client.dcp.AsyncCheckpointerType.PROCESS,
            )
    pending.result()

    # a restarted job
    path = ckpt_client.resume_path("llama", "run-42")
    if path is not None:
        dcp.load(state_dict, checkpoint_id=path)

Rank 0 of the save's process group (or the process that saves with `no_dist=True`) is the
only one that calls the catalog: it reserves the step (`writing`, kept alive while the
bytes are written), and once the upload completes it commits the checkpoint with a
manifest of the files the save wrote, or aborts the reservation when the save fails.
Every other rank passes `run=None` (it is ignored there) and only saves.

The process's first `async_save` reserves before `torch.distributed.checkpoint.async_save`
starts, and with more than one rank rank 0 tells the others whether its reservation was
taken before anyone writes, so that a refusal (a path under no tier, a token without the
scope, a step already registered with other content) fails every rank at once instead of
leaving them in the save's collectives without it. Later saves send their reservation
from a thread of their own while DCP stages and writes (a round trip to the service is
several times 1 % of a 100 MB save), and commit once both the reservation and the upload
are done; a refusal then is logged and that save goes on uncatalogued. `save` (blocking)
always reserves first.

The manifest: the files are the ones the write results name (each rank's `.distcp` files,
from the `Metadata` the save returns) and the `.metadata` file, sized from the storage
when the checkpoint is local (`file://`): the write results' extents are the file sizes
only in DCP's default layout, not with `serialization_format=SAFETENSORS` or stream
extensions. Elsewhere (an fsspec url), and when several ranks saved without collectives
(`use_collectives=False`: rank 0's results name only its own files), no manifest is sent
and the service lists the checkpoint itself.

Works with both async checkpointer types, `AsyncCheckpointerType.THREAD` (the default)
and `.PROCESS` (torch 2.14 has the enum in `torch.distributed.checkpoint.state_dict_saver`
only, so this module names it too), and with a stager that stages in the background
(`async_save` then answers an `AsyncSaveResponse`). The catalog's calls all happen in the
training process, the commit in the thread that completes the upload.

Needs torch (tested with 2.14), imported with this module; `import ckpt_client` alone
never imports it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from ckpt_client.courier import Courier
from ckpt_client.errors import CatalogError
from ckpt_client.models import Checkpoint, local_path_of, to_uri
from ckpt_client.reservation import Reservation
from ckpt_client.run import Run

log = logging.getLogger("ckpt_client")

__all__ = ["AsyncCheckpointerType", "SaveFuture", "async_save", "manifest", "save"]

METADATA_FILE = ".metadata"  # torch.distributed.checkpoint.filesystem._metadata_fn


class SaveFuture(Future[Checkpoint | None]):
    """What `async_save` returns: a `concurrent.futures.Future` whose result is the
    committed `Checkpoint` on rank 0, None on the other ranks and when the commit was
    spooled (the catalog unreachable past the client's deadline). It raises what the
    save raised (after the reservation is aborted) or what the catalog refused at commit.

    `staging_completion` is done once the state dict is staged (training may change it
    from then on), `upload_completion` is the framework's own future (its result the
    save's `Metadata`), `reservation` rank 0's `Reservation` (None elsewhere), `metadata`
    the `Metadata` once the upload completed."""

    def __init__(
        self,
        staging_completion: Future[Any],
        upload_completion: Future[Any],
        reserving: Future[Reservation | None],
    ) -> None:
        super().__init__()
        self.staging_completion = staging_completion
        self.upload_completion = upload_completion
        self._reserving = reserving
        self.metadata: Any = None

    @property
    def reservation(self) -> Reservation | None:
        """Rank 0's reservation once it is answered (it may still be on its way)."""
        return self._reserving.result()

    def cancel(self) -> bool:
        """A save under way cannot be cancelled (DCP's own future cannot either)."""
        return False

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The catalog's checkpoint as last answered (reserved, then committed)."""
        return self.reservation.checkpoint if self.reservation is not None else None


def async_save(
    state_dict: Mapping[str, Any],
    *,
    run: Run | None,
    step: int,
    checkpoint_id: str | os.PathLike[str] | None = None,
    cls: str = "rolling",
    metrics: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> SaveFuture:
    """`torch.distributed.checkpoint.async_save(state_dict, checkpoint_id=..., **kwargs)`
    with the step reserved first on rank 0 and committed when the upload completes (aborted
    if it fails); see the module's doc. `kwargs` go to DCP as they are (`storage_writer`,
    `planner`, `process_group`, `async_checkpointer_type`, `async_stager`, `no_dist`,
    `use_collectives`); without `checkpoint_id` the `storage_writer`'s is catalogued.

    `run` is required on rank 0 and ignored elsewhere. `metrics` and `labels` go with the
    checkpoint (`future.reservation.metrics` can still be added to until the commit).
    A failure before the upload starts (staging, a refused reservation) raises here."""
    where = _Where(checkpoint_id, kwargs)
    reserving = _reserving(run, step, where, cls, labels, metrics)
    try:
        answer = torch_dcp.async_save(dict(state_dict), checkpoint_id=checkpoint_id, **kwargs)
    except BaseException as error:
        _abort(reserving.result(), error)
        raise
    if isinstance(answer, Future):
        staged: Future[Any] = Future()
        staged.set_result(None)  # staged synchronously before async_save returned
        upload: Future[Any] = answer
    else:  # AsyncSaveResponse: staging goes on in the background
        staged, upload = answer.staging_completion, answer.upload_completion
    future = SaveFuture(staged, upload, reserving)
    upload.add_done_callback(_Finish(future, where))
    return future


def save(
    state_dict: Mapping[str, Any],
    *,
    run: Run | None,
    step: int,
    checkpoint_id: str | os.PathLike[str] | None = None,
    cls: str = "rolling",
    metrics: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Checkpoint | None:
    """`torch.distributed.checkpoint.save` between a reservation and its commit, as
    `async_save` does but blocking: the committed checkpoint on rank 0, None elsewhere (and
    when the commit was spooled). A failed save aborts the reservation and raises."""
    where = _Where(checkpoint_id, kwargs)
    reservation = _reserve(run, step, where, cls, labels, metrics, agree=True)
    try:
        metadata = torch_dcp.save(dict(state_dict), checkpoint_id=checkpoint_id, **kwargs)
    except BaseException as error:
        _abort(reservation, error)
        raise
    if reservation is None:
        return None
    return _commit(reservation, metadata, where)


def manifest(
    metadata: Any, directory: str | os.PathLike[str], *, metadata_file: str = METADATA_FILE
) -> list[dict[str, Any]] | None:
    """The files of a DCP checkpoint saved under the local `directory`, each with its size
    on disk: those the save's write results name (`metadata.storage_data`, the `Metadata`
    the save returns) and `metadata_file` (`__0.metadata` for a save of one rank without
    collectives). None when they cannot be told: a storage writer whose write results name
    no files, or a file that is not there."""
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, Mapping) or not storage:
        return None
    names: set[str] = set()
    for info in storage.values():
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str) or not path:
            return None
        names.add(path)
    names.add(metadata_file)
    root = Path(directory)
    files = []
    for name in sorted(names):
        try:
            size = (root / name).stat().st_size
        except OSError as error:
            log.warning("cannot size %s of the DCP checkpoint %s: %s", name, root, error)
            return None
        files.append({"path": name, "size_bytes": size})
    return files


# --- beneath -------------------------------------------------------------------------------


class _Where:
    """One save: its uri for the catalog, its local directory if it has one, this process's
    rank in the save's process group and the group's size as DCP sees them ((0, 1) when the
    save is not distributed), and the metadata file of a manifest rank 0 can tell (None:
    the service lists the checkpoint)."""

    def __init__(
        self, checkpoint_id: str | os.PathLike[str] | None, kwargs: Mapping[str, Any]
    ) -> None:
        target = checkpoint_id
        writer = kwargs.get("storage_writer")
        if target is None and writer is not None:
            target = getattr(writer, "checkpoint_id", None)
        if target is None:
            raise ValueError("a checkpoint_id (or a storage_writer that has one) is needed")
        if isinstance(target, str) and "://" not in target:
            target = Path(target)  # a plain path, as DCP takes it
        self.uri = to_uri(target) if isinstance(target, os.PathLike) else str(target)
        self.local = local_path_of(self.uri)
        self.group = kwargs.get("process_group")
        if kwargs.get("no_dist") or not dist.is_available() or not dist.is_initialized():
            self.rank, self.size = 0, 1
        else:
            self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.metadata_file: str | None = METADATA_FILE
        if not kwargs.get("use_collectives", True):
            # each rank writes its own `__<rank>.metadata`, and rank 0's result names only
            # its own files
            self.metadata_file = f"__0{METADATA_FILE}" if self.size == 1 else None


class _Saves:
    """Whether this process has made its first `async_save` (every rank makes the same
    calls, so every rank agrees on which one that is), and the courier rank 0 sends its
    later reservations through."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first_done = False
        self.courier = Courier("ckpt-dcp-catalog")

    def first(self) -> bool:
        with self.lock:
            first, self.first_done = not self.first_done, True
            return first


_SAVES = _Saves()


def _reserving(
    run: Run | None,
    step: int,
    where: _Where,
    cls: str,
    labels: Mapping[str, str] | None,
    metrics: Mapping[str, float] | None,
) -> Future[Reservation | None]:
    """The save's reservation, as a future. The process's first save reserves here and now
    (on every rank, see `_reserve`): a setting that refuses it (a path under no tier, a
    token without the scope, an ended run) fails the save before anything is written.
    Later saves send theirs from the courier's thread while DCP stages and writes, so
    the training never waits on the service; a refusal then is logged, and the save goes
    on uncatalogued."""
    first = _SAVES.first()
    if first or run is None or where.rank != 0:
        done: Future[Reservation | None] = Future()
        done.set_result(_reserve(run, step, where, cls, labels, metrics, agree=first))
        return done

    def reserve() -> Reservation | None:
        try:
            return _reserve(run, step, where, cls, labels, metrics, agree=False)
        except Exception as error:
            log.error("step %d is saved but not catalogued: %s", step, _describe(error))
            return None

    return _SAVES.courier.submit(reserve)


def _reserve(
    run: Run | None,
    step: int,
    where: _Where,
    cls: str,
    labels: Mapping[str, str] | None,
    metrics: Mapping[str, float] | None,
    *,
    agree: bool,
) -> Reservation | None:
    """Rank 0's reservation (None on the other ranks), agreed on by every rank when
    `agree` (every rank calls it then)."""
    rank, size, group = where.rank, where.size, where.group
    reservation: Reservation | None = None
    refusal: BaseException | None = None
    if rank == 0:
        if run is None:
            refusal = ValueError("rank 0 needs the run to catalogue the save in (run=None)")
        else:
            try:
                reservation = run.reserve(step, where.uri, cls=cls, labels=labels)
            except Exception as error:
                refusal = error
        if reservation is not None and metrics:
            reservation.metrics.update({k: float(v) for k, v in metrics.items()})
    if size > 1 and agree:
        said = [None if refusal is None else f"{type(refusal).__name__}: {refusal}"]
        source = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(said, src=source, group=group, device=torch.device("cpu"))
        if rank != 0 and said[0] is not None:
            raise RuntimeError(f"rank 0 could not reserve step {step} of the save: {said[0]}")
    if refusal is not None:
        raise refusal
    return reservation


def _describe(error: BaseException) -> str:
    """One line per failure: a CheckpointException's text is every rank's traceback, its
    `failures` the exception of each rank that failed."""
    failures = getattr(error, "failures", None)
    if isinstance(error, torch_dcp.CheckpointException) and isinstance(failures, Mapping):
        return "; ".join(
            f"rank {rank}: {_describe(failure[0])}" for rank, failure in sorted(failures.items())
        )
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _abort(reservation: Reservation | None, error: BaseException) -> None:
    if reservation is None:
        return
    try:
        reservation.abort(f"DCP save failed: {_describe(error)}")
    except (CatalogError, OSError) as failure:
        # the save's own error matters more; the service abandons the reservation anyway
        log.warning("could not abort the reservation of step %d: %s", reservation.step, failure)


def _commit(reservation: Reservation, metadata: Any, where: _Where) -> Checkpoint | None:
    files = None
    if where.local is not None and where.metadata_file is not None:
        files = manifest(metadata, where.local, metadata_file=where.metadata_file)
    return reservation.commit(files=files)


class _Finish:
    """The upload's done callback: commit or abort, then resolve the SaveFuture. Runs in
    the thread that completed the upload (the caller's, if it was done already)."""

    def __init__(self, future: SaveFuture, where: _Where) -> None:
        self.future = future
        self.where = where

    def __call__(self, upload: Future[Any]) -> None:
        reservation = self.future.reservation
        try:
            metadata = upload.result()
        except BaseException as error:
            _abort(reservation, error)
            self.future.set_exception(error)
            return
        self.future.metadata = metadata
        if reservation is None:
            self.future.set_result(None)
            return
        try:
            committed = _commit(reservation, metadata, self.where)
        except BaseException as error:
            log.error(
                "the DCP save of step %d is written but its commit failed: %s",
                reservation.step,
                error,
            )
            self.future.set_exception(error)
            return
        self.future.set_result(committed)
