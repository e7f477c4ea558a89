"""Lightning: every checkpoint the Trainer writes is catalogued, and Lightning deletes none.

    from ckpt_client.lightning import CatalogCallback
    trainer = pl.Trainer(
        callbacks=[ModelCheckpoint(dirpath=..., every_n_train_steps=500, save_top_k=-1),
                   CatalogCallback(project="llama", run_name="run-42")],
    )
    trainer.fit(model, ckpt_path=ckpt_client.resume_path("llama", "run-42"))

`CatalogCheckpointIO` wraps the strategy's own `CheckpointIO`: `save_checkpoint` asks for the
step's reservation (`committed: false`) before the inner write starts and for its commit, with
the metrics of the moment, when the write returns; a failed write asks for an abort. Those
calls go out in that order from a thread of the IO's own, so neither the training loop nor
Lightning's writer waits on the service (the reservation travels while the bytes are
written). Under Lightning's `AsyncCheckpointIO` it sits *inside* the asynchronous wrapper, so
the commit is asked for exactly when the background write completes (there is no other
completion hook). A refusal that is a setting to fix (a path under no tier, a token without
the scope) stops the fit at the next save or at its end. `remove_checkpoint` deletes
nothing: what is kept is the service's policy's business.

`CatalogCallback` installs the IO on the trainer's strategy, snapshots
`trainer.callback_metrics` when each checkpoint is dumped (on the training thread), classes
saves (`rolling`, `milestone` every `milestone_every_n_steps`), promotes the last save of
`fit` to `final` once it is written, and ends the run `completed` or `failed` with the fit.
Only global rank zero talks to the service (it is the only one Lightning lets write).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from ckpt_client.client import Client
from ckpt_client.courier import Courier
from ckpt_client.errors import CatalogError, Conflict, Unavailable
from ckpt_client.models import Checkpoint, scalars, to_uri
from ckpt_client.reservation import Reservation
from ckpt_client.run import Run
from ckpt_client.transport import segment

log = logging.getLogger("ckpt_client")

__all__ = ["CatalogCallback", "CatalogCheckpointIO"]


@dataclass
class _Save:
    """What the catalog knows of one save of this process."""

    step: int
    uri: str
    checkpoint: Checkpoint | None = None  # None: never reached the catalog (spooled)
    committed: bool = False


@dataclass
class _Note:
    """What the training thread noted when a checkpoint was dumped, for its writer."""

    cls: str = "rolling"
    metrics: dict[str, float] = field(default_factory=dict)


def _uri_of(path: str | os.PathLike[str]) -> str:
    """The catalog uri of a path Lightning writes to: remote ones (`s3://`, any fsspec
    protocol) as they are, local ones as `file://` of their absolute form."""
    text = os.fspath(path)
    if "://" in text:
        return text
    return to_uri(Path(text))


class CatalogCheckpointIO(_WrappingCheckpointIO):
    """A `CheckpointIO` that catalogs each save of the one it wraps (the strategy's own,
    `TorchCheckpointIO` by default, filled in by Lightning when left None).

    Give it `run=` (a `Run` already attached) or `project=` and `run_name=` (attached at the
    first save, through `client` or a `Client()` from the environment). Used alone, every
    save is `rolling` without metrics; `CatalogCallback` installs one and tells it more.
    Saves are told apart by `checkpoint["global_step"]`; a second save at a step this
    process has catalogued already (Lightning's `last.ckpt` beside the step's own file) is
    written but not catalogued."""

    def __init__(
        self,
        checkpoint_io: CheckpointIO | None = None,
        *,
        run: Run | None = None,
        project: str | None = None,
        run_name: str | None = None,
        client: Client | None = None,
    ) -> None:
        super().__init__(checkpoint_io)
        if run is None and (project is None or run_name is None):
            raise ValueError("CatalogCheckpointIO needs run= or both project= and run_name=")
        self.run = run
        self._project = project
        self._run_name = run_name
        self._client = client
        self._lock = threading.Lock()
        self._notes: dict[int, _Note] = {}
        self.saves: dict[int, _Save] = {}  # this process's catalogued saves, by step
        self.last: _Save | None = None  # the latest save written (the final-to-be)
        # The catalog's calls, in the order asked, on a thread of their own: a save never
        # waits on the service, and a commit still follows its reservation.
        self._courier = Courier("ckpt-lightning-catalog")
        self._refusal: CatalogError | None = None  # a refusal that stops the fit

    def _attached(self) -> Run:
        if self.run is None:
            assert self._project is not None and self._run_name is not None
            client = self._client if self._client is not None else Client()
            self.run = client.run(self._project, self._run_name)
        return self.run

    def note(self, step: int, *, cls: str, metrics: Mapping[str, float]) -> None:
        """The class and metrics of the checkpoint about to be saved at `step` (called on
        the training thread; the write may happen later, on another)."""
        with self._lock:
            self._notes[step] = _Note(cls, dict(metrics))

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Reserve, write with the wrapped IO, commit (abort if the write raises)."""
        assert self.checkpoint_io is not None
        step = int(checkpoint.get("global_step", 0))
        uri = _uri_of(path)
        with self._lock:
            note = self._notes.pop(step, None) or _Note()
            again = self.saves.get(step)
            if again is None and any(s.uri == uri for s in self.saves.values()):
                log.warning("%s is written over in place: the catalog keeps its first save", uri)
        if again is not None:  # the same step under another name: write it, catalog nothing
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        self._raise_refusal()  # an earlier save's, found out since: before this one starts
        save = _Save(step, uri)
        with self._lock:
            self.saves[step] = save
        reserving = self._courier.submit(partial(self._reserve, save, note.cls))
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        except BaseException as error:
            self._courier.submit(partial(self._abort_after, reserving, error))
            raise
        with self._lock:
            if self.last is None or step >= self.last.step:
                self.last = save
        self._courier.submit(partial(self._commit_after, save, reserving, note.metrics))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every reservation and commit asked for so far has been sent (or
        spooled), then raise what the catalog refused that stops the fit, if anything."""
        self._courier.drain(timeout)
        self._raise_refusal()

    def _raise_refusal(self) -> None:
        with self._lock:
            refusal, self._refusal = self._refusal, None
        if refusal is not None:
            raise refusal

    def _reserve(self, save: _Save, cls: str) -> Reservation | None:
        """On the courier's thread: the reservation, or None when there is none (the catalog
        away with on_unavailable="raise", or a refusal)."""
        try:
            pending = self._attached().reserve(save.step, save.uri, cls=cls)
        except Unavailable as error:  # on_unavailable="raise": the write still goes on
            log.warning("step %d is saved uncatalogued: %s", save.step, error)
            return None
        except CatalogError as error:
            self._refused(save.step, save.uri, error)
            return None
        save.checkpoint = pending.checkpoint
        return pending

    def _abort_after(self, reserving: Future[Reservation | None], error: BaseException) -> None:
        pending = reserving.result()
        if pending is not None:
            self._abort(pending, error)

    def _commit_after(
        self, save: _Save, reserving: Future[Reservation | None], metrics: dict[str, float]
    ) -> None:
        pending = reserving.result()
        if pending is not None:
            self._commit(save, pending, metrics)

    def _refused(self, step: int, uri: str, error: CatalogError) -> None:
        """The catalog refused the reservation: the bytes are written all the same. A
        conflict (another checkpoint there) is worth a warning; anything else (a path under
        no tier, a token without the scope) is a setting to fix, and stops the fit at the
        next save (or at its end)."""
        if isinstance(error, Conflict):
            log.warning("step %d (%s) is not catalogued: %s", step, uri, error)
            return
        with self._lock:
            self._refusal = self._refusal or error

    def _commit(self, save: _Save, pending: Reservation, metrics: dict[str, float]) -> None:
        try:
            done = pending.commit(metrics=metrics)
        except CatalogError as error:  # a lapsed reservation, say: the training goes on
            log.warning("the commit of step %d was refused: %s", save.step, error)
            return
        if done is not None:
            save.checkpoint = done
        save.committed = True

    def _abort(self, pending: Reservation, error: BaseException) -> None:
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        try:
            pending.abort(reason)
        except (CatalogError, OSError) as failure:  # the service abandons it anyway
            log.warning("could not abort the reservation of step %d: %s", pending.step, failure)

    def remove_checkpoint(self, path: Any) -> None:
        """Deletes nothing: the service's policy decides what goes, and when."""
        log.debug("not removing %s: deletion is left to the catalog's policy", path)

    def teardown(self) -> None:
        if self.checkpoint_io is not None:
            self.checkpoint_io.teardown()
        self.flush()


def _catalog_io_of(io: CheckpointIO) -> CatalogCheckpointIO | None:
    """The `CatalogCheckpointIO` in a chain of wrapping IOs, if there is one."""
    while io is not None:
        if isinstance(io, CatalogCheckpointIO):
            return io
        io = getattr(io, "checkpoint_io", None) if isinstance(io, _WrappingCheckpointIO) else None
    return None


class CatalogCallback(Callback):
    """Catalogs a `fit`: installs a `CatalogCheckpointIO` on the strategy (inside an
    `AsyncCheckpointIO` if the strategy has one), sends `trainer.callback_metrics` with
    each checkpoint, classes saves, promotes the last one to `final` and ends the run.

    `project=` and `run_name=` (with `labels`, `policy`, `resumed_from` for a new run; the
    run is created or re-attached at `setup`), or `run=`. `milestone_every_n_steps` makes
    the saves at those steps `milestone`. `final=False` leaves the last save's class alone;
    `end_run=False` leaves the run `active` after the fit (more fits to come)."""

    def __init__(
        self,
        *,
        project: str | None = None,
        run_name: str | None = None,
        run: Run | None = None,
        client: Client | None = None,
        labels: Mapping[str, str] | None = None,
        policy: str | None = None,
        resumed_from: str | Checkpoint | None = None,
        milestone_every_n_steps: int | None = None,
        final: bool = True,
        end_run: bool = True,
    ) -> None:
        if run is None and (project is None or run_name is None):
            raise ValueError("CatalogCallback needs run= or both project= and run_name=")
        if milestone_every_n_steps is not None and milestone_every_n_steps <= 0:
            raise ValueError("milestone_every_n_steps must be a positive number of steps")
        self.run = run
        self.project = project if run is None else run.project
        self.run_name = run_name if run is None else run.name
        self._client = client
        self._labels = dict(labels or {})
        self._policy = policy
        self._resumed_from = resumed_from
        self.milestone_every_n_steps = milestone_every_n_steps
        self.final = final
        self.end_run = end_run
        self.io: CatalogCheckpointIO | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.run.client if self.run is not None else Client()
        return self._client

    def classify(self, step: int) -> str:
        """The class a save at `step` is registered with."""
        every = self.milestone_every_n_steps
        return "milestone" if every is not None and step > 0 and step % every == 0 else "rolling"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.save_top_k != -1:
                warnings.warn(
                    f"ModelCheckpoint(save_top_k={callback.save_top_k}): set save_top_k=-1. "
                    "The catalog deletes through its policy; Lightning's own removals are "
                    "ignored, so its top-k bookkeeping no longer says what is on disk.",
                    stacklevel=2,
                )
        if self.run is None:
            assert self.project is not None and self.run_name is not None
            self.run = self.client.run(
                self.project,
                self.run_name,
                labels=self._labels,
                policy=self._policy,
                resumed_from=self._resumed_from,
            )
        self.io = self._install(trainer.strategy)

    def _install(self, strategy: Any) -> CatalogCheckpointIO:
        """Put a `CatalogCheckpointIO` on the strategy, around its own IO, and inside an
        `AsyncCheckpointIO` (a new one around the catalog's) so that the commit follows
        the background write."""
        assert self.run is not None
        current = strategy.checkpoint_io  # Lightning fills in TorchCheckpointIO here
        present = _catalog_io_of(current)
        if present is not None:
            present.run = present.run or self.run
            return present
        if isinstance(current, AsyncCheckpointIO):
            io = CatalogCheckpointIO(current.checkpoint_io, run=self.run)
            strategy.checkpoint_io = AsyncCheckpointIO(io)
        else:
            io = CatalogCheckpointIO(current, run=self.run)
            strategy.checkpoint_io = io
        return io

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning has loaded `ckpt_path` by now: name that checkpoint as the run's
        # `resumed_from`, which protects it from every rule for the rest of the run.
        path = trainer.ckpt_path
        if self.run is None or path is None or not trainer.is_global_zero:
            return
        try:
            self._link_resumption(_uri_of(path))
        except CatalogError as error:
            log.warning("could not record the resumption from %s: %s", path, error)

    def _link_resumption(self, uri: str) -> None:
        assert self.run is not None
        for checkpoint in self.run.checkpoints(state="active"):
            if uri == checkpoint.uri or any(loc.uri == uri for loc in checkpoint.locations):
                if self.run.resumed_from != checkpoint.id:
                    path = f"/v1/runs/{segment(self.run.id)}"
                    self.run._update(
                        self.client.call("PATCH", path, json={"resumed_from": checkpoint.id})
                    )
                return

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.io is None or not trainer.is_global_zero:
            return
        step = int(checkpoint.get("global_step", trainer.global_step))
        metrics = scalars(trainer.callback_metrics)
        self.io.note(step, cls=self.classify(step), metrics=metrics)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        # Lightning tore the strategy down first: every background write has completed.
        if self.io is None or not trainer.is_global_zero:
            return
        self.io.flush()  # every commit is in: the last save may be promoted
        if self.final:
            self._promote_last()
        if self.end_run and self.run is not None:
            self.run.complete()

    def _promote_last(self) -> None:
        last = self.io.last if self.io is not None else None
        if last is None or last.checkpoint is None or not last.committed:
            if last is not None:
                log.warning("the last save (step %d) is not in the catalog: no final", last.step)
            return
        try:
            last.checkpoint = self.client.update_checkpoint(last.checkpoint.id, cls="final")
        except CatalogError as error:
            log.warning("step %d could not be made final: %s", last.step, error)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.run is None or not self.end_run or not trainer.is_global_zero:
            return
        try:
            self.run.fail()
        except CatalogError as error:  # the fit's own exception matters more
            log.warning("could not mark run %s failed: %s", self.run.name, error)
