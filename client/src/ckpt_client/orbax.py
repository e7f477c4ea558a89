"""Orbax saves, catalogued: `CatalogCheckpointManager`, an `orbax.checkpoint.CheckpointManager`.

    import orbax.checkpoint as ocp
    from ckpt_client.orbax import CatalogCheckpointManager

    with CatalogCheckpointManager(
        "/mnt/ckpt/hot/llama/run-42",
        options=ocp.CheckpointManagerOptions(save_interval_steps=500),  # no max_to_keep
        project="llama", run_name="run-42",
    ) as mngr:
        start = mngr.resume_step()              # the newest committed step, per the catalog
        if start is not None:
            state = mngr.restore(start, args=ocp.args.StandardRestore(abstract_state))
        for step in range((start or 0) + 1, steps + 1):
            ...
            mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": loss})

Each save writes `<directory>/<step>.orbax-checkpoint-tmp-*` and, once the bytes are down
and finalized, renames it to `<directory>/<step>` in orbax's background threads. The
catalog follows that: the step is reserved (`writing`, uri the final `<directory>/<step>`,
which no policy acts on) as soon as the blocking part of `save` returns, and committed
only after the rename, with the manifest of the final directory; a save that fails aborts
its reservation. A job killed mid-save leaves a `writing` reservation the service abandons
and aborts, never an `active` checkpoint whose directory is still a temporary one.

Why a private hook: orbax's public `post_finalization_callback` runs *before* the rename
(orbax-checkpoint 0.12.8, `AsyncCheckpointer._make_on_commit_callback`), so a commit there
could make a temporary directory `active`. The one place that runs after the rename, in the
finalize thread of an asynchronous save as inline in a synchronous one, is
`CheckpointManager._finalize(step, steps_to_remove)`; this class overrides it, and only it.
Importing this module checks that method is there with that signature and raises
`ImportError` if not, and `wait_until_finished` raises if a save was never finalized
through it, so a change in orbax fails loudly instead of leaving saves uncatalogued.

Deletion is the service's policy's: `max_to_keep=None` and no `preservation_policy` are
forced (with a warning if set), orbax's deleter gets no steps, `delete` deletes nothing.

The catalog's calls run in a thread of the manager's own, in the order of the saves:
neither the training step nor orbax's finalize thread waits on the service, and an outage
costs a save nothing (the commit is spooled past the client's deadline, see `Client`).
`wait_for_catalog()` and `close()` wait for them. Only orbax's primary host calls.

`latest_step()` stays orbax's own (it is called every step). `resume_step()` asks the
catalog; `restore` notes the step restored as the run's `resumed_from`, which the service
protects while the run is active. A checkpoint the service staged onto a tier is a
directory named `step-<N>` (where `resume_path` points), which orbax's step names do not
match: restore it with `restore_from(path, args=...)`.

Needs `orbax-checkpoint` (tested with 0.12.8, JAX on the CPU), imported with this module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import multihost

from ckpt_client.client import Client
from ckpt_client.courier import Courier
from ckpt_client.errors import CatalogError, Unavailable
from ckpt_client.models import directory_manifest as manifest
from ckpt_client.models import local_path_of, scalars, to_uri
from ckpt_client.reservation import Reservation
from ckpt_client.run import Run
from ckpt_client.transport import segment

log = logging.getLogger("ckpt_client")

__all__ = ["CatalogCheckpointManager", "manifest", "step_of"]

TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of a step directory being written
_HOOK = ("self", "step", "steps_to_remove")


def _check_hook() -> None:
    """The one private method this module overrides must be as orbax 0.12.8 has it."""
    hook = getattr(ocp.CheckpointManager, "_finalize", None)
    names = tuple(inspect.signature(hook).parameters) if callable(hook) else ()
    if names != _HOOK:
        raise ImportError(
            "ckpt_client.orbax commits a save after orbax renames it into place, from "
            "CheckpointManager._finalize(self, step, steps_to_remove) (orbax-checkpoint "
            f"0.12.8); orbax-checkpoint {getattr(ocp, '__version__', '?')} has "
            f"{names or 'no such method'}: the integration needs updating"
        )


_check_hook()


@dataclass
class _Save:
    """One save of this manager, as the catalog hears of it."""

    step: int
    uri: str
    cls: str
    metrics: dict[str, float]
    reservation: Reservation | None = None
    refused: CatalogError | None = None
    reserve_sent: bool = False  # by save() returning, or by _finalize if that came first


def step_of(path: str | os.PathLike[str]) -> int | None:
    """The step a step directory is named for: `<N>`, `step-<N>` (a copy the service
    staged), `<prefix>_<N>`; None if its name ends in no number."""
    found = re.search(r"(\d+)$", Path(os.fspath(path)).name)
    return int(found.group(1)) if found else None


def _catalogue_options(options: Any) -> Any:
    """The user's options with orbax's own retention switched off (warned about)."""
    options = options if options is not None else ocp.CheckpointManagerOptions()
    if options.max_to_keep is not None or options.preservation_policy is not None:
        log.warning(
            "CatalogCheckpointManager: max_to_keep=%s / preservation_policy=%s ignored: the "
            "catalog's policy decides which checkpoints are deleted, and orbax deletes none",
            options.max_to_keep,
            options.preservation_policy,
        )
    return dataclasses.replace(options, max_to_keep=None, preservation_policy=None)


class CatalogCheckpointManager(ocp.CheckpointManager):
    """A `CheckpointManager` whose saves are reserved, committed or aborted in the catalog;
    see the module's doc.

    `directory`, `options`, `metadata`, `item_names`, `item_handlers`, `logger` and
    `handler_registry` are orbax's. The run is `run=` (one already attached, as a
    benchmark passes it) or `project=`/`run_name=` (created or re-attached here, through
    `client` or a `Client()` from the environment; `labels` and `policy` apply to a new
    run). Saves are `cls` (default `rolling`), `milestone` at multiples of
    `milestone_every_n_steps`; orbax's `metrics=` go with them."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        options: Any = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        item_names: Any = None,
        item_handlers: Any = None,
        logger: Any = None,
        handler_registry: Any = None,
        run: Run | None = None,
        project: str | None = None,
        run_name: str | None = None,
        client: Client | None = None,
        labels: Mapping[str, str] | None = None,
        policy: str | None = None,
        cls: str = "rolling",
        milestone_every_n_steps: int | None = None,
    ) -> None:
        if run is None and (not project or not run_name):
            raise ValueError("CatalogCheckpointManager needs run= or project= and run_name=")
        if run is not None and (project or run_name):
            raise ValueError("CatalogCheckpointManager takes run= or project=/run_name=")
        if milestone_every_n_steps is not None and milestone_every_n_steps < 1:
            raise ValueError("milestone_every_n_steps must be a positive number of steps")
        options = _catalogue_options(options)
        self.cls = cls
        self.milestone_every_n_steps = milestone_every_n_steps
        self._pending: dict[int, _Save] = {}  # saving, not finalized yet
        self._returned: set[int] = set()  # of those, the ones whose save() returned
        self._lock = threading.Lock()
        self._courier = Courier("ckpt-orbax-catalog")
        self._owns_client = False
        self.run: Run | None = None
        primary = options.multiprocessing_options.primary_host
        if primary is None or multihost.process_index() == primary:
            if run is None:
                assert project is not None and run_name is not None
                self._owns_client = client is None
                catalog = client if client is not None else Client()
                run = catalog.run(project, run_name, labels=labels, policy=policy)
            self.run = run
        super().__init__(
            directory,
            options=options,
            metadata=metadata,
            item_names=item_names,
            item_handlers=item_handlers,
            logger=logger,
            handler_registry=handler_registry,
        )
        name_format = options.step_name_format or ocp.path.step.standard_name_format(
            step_prefix=options.step_prefix,
            step_format_fixed_length=options.step_format_fixed_length,
        )
        self._name_format = name_format

    # --- orbax's interface ------------------------------------------------------------

    def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        """orbax's `save`; the step is reserved once its blocking part returns."""
        if self.run is None:
            return bool(super().save(step, *args, **kwargs))
        path = ocp.path.step.build_step_path(self.directory, self._name_format, step)
        text = str(path)  # an epath: local, or a bucket's url
        uri = text if "://" in text else to_uri(Path(text))
        save = _Save(step, uri, self.classify(step), scalars(kwargs.get("metrics")))
        with self._lock:
            self._pending[step] = save
        try:
            saved = bool(super().save(step, *args, **kwargs))
        except BaseException:
            with self._lock:
                self._pending.pop(step, None)  # not finalized, so never reserved
            raise
        with self._lock:
            send = False
            if not saved:
                self._pending.pop(step, None)
            elif step in self._pending:  # asynchronous: finalized in orbax's thread
                self._returned.add(step)
                send, save.reserve_sent = not save.reserve_sent, True
        if send:  # the reservation travels while orbax writes in the background
            self._submit(functools.partial(self._reserve, save))
        return saved

    def _finalize(self, step: int, steps_to_remove: list[int]) -> None:
        """orbax's finalization (after the write, the rename into place) with no steps to
        delete; the commit or abort is handed over after it (behind the reservation,
        which save() sent when it returned, or which is sent here if it has not been)."""
        with self._lock:
            save = self._pending.pop(step, None)
            self._returned.discard(step)
            send = save is not None and not save.reserve_sent
            if save is not None:
                save.reserve_sent = True
        if send:  # a synchronous save, or one finalized before save() returned
            assert save is not None
            self._submit(functools.partial(self._reserve, save))
        if steps_to_remove:
            log.warning("orbax meant to delete steps %s: left to the catalog", steps_to_remove)
        try:
            super()._finalize(step, [])
        except BaseException as error:
            if save is not None:  # (the name `error` is gone once the except clause ends)
                self._submit(functools.partial(self._abort, save, error))
            raise
        if save is not None:
            self._submit(functools.partial(self._commit, save))

    def wait_until_finished(self) -> None:
        """orbax's; also raises if a save it finished never went through `_finalize` (an
        orbax whose internals moved: its saves would go uncatalogued)."""
        super().wait_until_finished()
        with self._lock:
            lost = sorted(self._returned)
        if lost:
            raise RuntimeError(
                f"orbax finished saving steps {lost} without CheckpointManager._finalize: "
                "ckpt_client.orbax cannot catalogue them with this orbax-checkpoint"
            )

    def delete(self, step: int) -> None:
        """Deletes nothing: the catalog's policy decides what goes, and when."""
        log.warning("not deleting step %d: deletion is left to the catalog's policy", step)

    def restore(self, step: int | None, *args: Any, **kwargs: Any) -> Any:
        """orbax's `restore`; the run's `resumed_from` becomes that step's checkpoint."""
        restored = super().restore(step, *args, **kwargs)
        if step is not None and kwargs.get("directory") is None:
            self._submit(functools.partial(self._link_resumption, step))
        return restored

    def close(self) -> None:
        """orbax's `close`, then the catalog's calls still to make."""
        try:
            super().close()
        finally:
            self._courier.close()
            if self._owns_client and self.run is not None:
                self.run.client.close()
                self._owns_client = False

    # --- the catalog's side ----------------------------------------------------------------

    def classify(self, step: int) -> str:
        every = self.milestone_every_n_steps
        return "milestone" if every is not None and step > 0 and step % every == 0 else self.cls

    def resume_step(self) -> int | None:
        """The newest committed (`active`) step of the run per the catalog, None if it has
        none; orbax's `latest_step()` (with a warning) when the catalog is unreachable."""
        if self.run is None:
            return self.latest_step()  # type: ignore[no-any-return]
        self.wait_for_catalog()
        try:
            latest = self.run.latest()
        except Unavailable as error:
            log.warning("the catalog is unreachable; resuming from orbax's latest: %s", error)
            return self.latest_step()  # type: ignore[no-any-return]
        return None if latest is None else latest.step

    def restore_from(self, path: str | os.PathLike[str], args: Any) -> Any:
        """Restore the step directory `path` itself, whatever its name: a copy the service
        staged (`step-<N>`, from `ckpt_client.resume_path`) or one of this manager's.
        `args` as for `restore` (one item's args, or a `Composite`). The run's
        `resumed_from` becomes the checkpoint of that step."""
        if not isinstance(args, ocp.args.Composite):
            args = ocp.args.Composite(**{ocp.checkpoint_manager.DEFAULT_ITEM_NAME: args})
            single = True
        else:
            single = False
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(Path(os.fspath(path)), args=args)
        step = step_of(path)
        if step is not None:
            self._submit(functools.partial(self._link_resumption, step))
        return restored[ocp.checkpoint_manager.DEFAULT_ITEM_NAME] if single else restored

    def wait_for_catalog(self, timeout: float | None = None) -> bool:
        """Wait until the catalog's calls handed over so far are made (or spooled); False
        if `timeout` passed first."""
        return self._courier.drain(timeout)

    def _submit(self, task: Callable[[], None]) -> None:
        if self.run is not None:
            self._courier.submit(task)

    def _reserve(self, save: _Save) -> None:
        assert self.run is not None
        try:
            save.reservation = self.run.reserve(save.step, save.uri, cls=save.cls)
        except CatalogError as error:  # refused (or unreachable with on_unavailable=raise)
            save.refused = error
            log.error("step %d (%s) is saved uncatalogued: %s", save.step, save.uri, error)

    def _commit(self, save: _Save) -> None:
        pending = save.reservation
        if pending is None:
            return
        path = local_path_of(save.uri)
        files = None
        if path is not None:
            if not path.is_dir() or TMP_MARK in path.name:
                reason = f"orbax finalized step {save.step} but {path} is not in place"
                log.error("%s: its reservation is aborted", reason)
                self._abort(save, RuntimeError(reason))
                return
            files = manifest(path)
        try:
            pending.commit(files=files, metrics=save.metrics)
        except CatalogError as error:  # a lapsed reservation, say: training goes on
            log.error("the commit of step %d was refused: %s", save.step, error)

    def _abort(self, save: _Save, error: BaseException) -> None:
        if save.reservation is None:
            return
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        try:
            save.reservation.abort(f"orbax save failed: {text}")
        except (CatalogError, OSError) as failure:  # the service abandons it anyway
            log.warning("could not abort the reservation of step %d: %s", save.step, failure)

    def _link_resumption(self, step: int) -> None:
        """The run's `resumed_from`: its active checkpoint of `step`, if it has one."""
        run = self.run
        assert run is not None
        try:
            for checkpoint in run.checkpoints(state="active"):  # newest first
                if checkpoint.step == step:
                    body: dict[str, str] = {}
                    if run.resumed_from != checkpoint.id:
                        body["resumed_from"] = checkpoint.id
                    if run.status != "active":
                        body["status"] = "active"  # a job trains on it again
                    if body:
                        path = f"/v1/runs/{segment(run.id)}"
                        run._update(run.client.call("PATCH", path, json=body))
                    return
                if checkpoint.step < step:
                    break
        except CatalogError as error:
            log.warning("could not record the resumption from step %d: %s", step, error)
