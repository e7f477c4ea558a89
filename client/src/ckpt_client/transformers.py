"""The Hugging Face `Trainer` hands its checkpoints to the catalog: `CatalogCallback`.

    from ckpt_client import resume_path
    from ckpt_client.transformers import CatalogCallback

    args = TrainingArguments(output_dir="/mnt/ckpt/hot/llama/run-42", save_steps=500,
                             save_total_limit=None)       # the service's policy deletes
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[CatalogCallback(project="llama", run_name="run-42")])
    trainer.train(resume_from_checkpoint=resume_path("llama", "run-42"))

The Trainer writes `<output_dir>/checkpoint-<global_step>` whole (weights, optimizer,
scheduler, RNG and `trainer_state.json` last) and only then calls `on_save`, so the
registration there is of a complete directory: a save killed before it leaves a directory
the catalog never heard of, never an `active` checkpoint with half its files, and the
service never deletes what it does not know. That is why no reservation is needed here
(the Trainer saves synchronously). The callback deletes nothing; the Trainer's own rotation
(`save_total_limit`) should be off, since it runs before `on_save` and would race the
service's policy.

Only the world's process zero talks to the service. It needs `transformers` (the
`ckpt-client[transformers]` extra); importing `ckpt_client` alone does not.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ckpt_client.client import Client
from ckpt_client.courier import Courier
from ckpt_client.errors import CatalogError, Unavailable
from ckpt_client.models import Checkpoint, FileEntry
from ckpt_client.models import directory_manifest as manifest
from ckpt_client.run import Run
from ckpt_client.transport import segment

log = logging.getLogger("ckpt_client")

PREFIX = "checkpoint"  # transformers' PREFIX_CHECKPOINT_DIR
BEST_LABEL = "best"  # on the best checkpoint so far, its value the metric's name
METRIC_KEY_LIMIT = 63  # the service's longest metric name
METRICS_LIMIT = 256  # and most metrics on one checkpoint


@dataclass
class _Best:
    step: int
    value: float
    cls: str
    checkpoint_id: str | None  # None while its registration waits in the spool


@dataclass
class _Save:
    """What a save registers, taken when `on_save` runs (the directory is whole then)."""

    step: int
    path: Path
    cls: str
    files: list[FileEntry]
    metrics: dict[str, float]
    best: _Best | None = None  # this save is the best so far
    former: _Best | None = None  # and that one was, until now


class CatalogCallback(TrainerCallback):
    """Registers each checkpoint the Trainer saves, promotes the last one to `final` and
    completes the run when training ends.

    The run is `project`/`run_name` (created, or attached to when a restarted job comes
    back), or `run`, one already attached; `client` defaults to a `Client()` from the
    environment (`CKPT_URL`, `CKPT_TOKEN`). `labels` and `policy` apply when the run is
    created.

    Every save is registered `rolling`, with the metrics of the latest evaluation in
    `state.log_history` (its `eval_*` numbers), except:
    - a step that is a multiple of `milestone_every_n_steps`: `milestone`;
    - with `metric_for_best_model` (else the Trainer's own `args.metric_for_best_model`),
      the best checkpoint so far: `milestone`, labelled `best`. When a later save beats it,
      the previous best loses the label and, unless it is a milestone by step or the final,
      goes back to `rolling` for the policy to rotate. `greater_is_better` defaults as the
      Trainer's does (False for a name ending in `loss`). Only an evaluation made at the
      save's own step makes a checkpoint the best.

    Training that starts from a checkpoint (`state.global_step > 0`) names the run's
    checkpoint of that step as the run's `resumed_from`, which the service protects while
    the run is active, and reopens the run if it had ended.

    Registrations run in a thread of the callback's own, in the order of the saves:
    `on_save` takes the directory's manifest and returns, training goes on while the
    service answers, and the end of training (or the interpreter's exit, if training
    raised) waits for the registrations still to make. The catalog being unreachable never
    fails a save: the registration is spooled (see `Client`) and sent later; a refusal (a
    4xx) is logged and training goes on. Attaching the run when training begins is not
    spooled: a job that cannot reach the catalog then gets `Unavailable` before it has
    trained a step, and one whose `output_dir` lies under none of the service's local tiers
    a `ValueError`.
    """

    def __init__(
        self,
        project: str | None = None,
        run_name: str | None = None,
        *,
        run: Run | None = None,
        client: Client | None = None,
        labels: Mapping[str, str] | None = None,
        policy: str | None = None,
        milestone_every_n_steps: int | None = None,
        metric_for_best_model: str | None = None,
        greater_is_better: bool | None = None,
    ) -> None:
        if run is None and (not project or not run_name):
            raise ValueError("CatalogCallback needs project= and run_name=, or run=")
        if run is not None and (project or run_name):
            raise ValueError("CatalogCallback takes run= or project= and run_name=, not both")
        if milestone_every_n_steps is not None and milestone_every_n_steps < 1:
            raise ValueError("milestone_every_n_steps must be a positive number of steps")
        self.project = run.project if run is not None else str(project)
        self.run_name = run.name if run is not None else str(run_name)
        self.milestone_every_n_steps = milestone_every_n_steps
        self.metric_for_best_model = metric_for_best_model
        self.greater_is_better = greater_is_better
        self._labels = dict(labels or {})
        self._policy = policy
        self._client = run.client if run is not None else client
        self._owns_client = run is None and client is None
        self._run = run
        self._metric: str | None = None
        self._greater = False
        self._best: _Best | None = None
        self._demote: list[_Best] = []  # former bests still labelled, for want of the service
        self._last: Checkpoint | None = None  # the last save this process registered
        self._last_class: str | None = None  # and its class (also when spooled)
        self._warned_rotation = False
        self._courier = Courier("ckpt-transformers-catalog")  # registers the saves, in order

    @property
    def run(self) -> Run | None:
        """The run checkpoints are registered under, once training has begun."""
        return self._run

    # --- the Trainer's events --------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self._courier.close()  # a train() before that raised may have left saves to register
        if args.save_total_limit and not self._warned_rotation:
            self._warned_rotation = True
            log.warning(
                "save_total_limit=%s: the Trainer deletes checkpoints itself, before on_save, "
                "racing the catalog's policy (which may keep what it deletes); set "
                "save_total_limit=None and let the service's policy decide",
                args.save_total_limit,
            )
        greater = self.greater_is_better
        if greater is None and not self.metric_for_best_model:
            greater = args.greater_is_better  # TrainingArguments settled it for its metric
        self._metric, self._greater = _best_metric(
            self.metric_for_best_model or args.metric_for_best_model, greater
        )
        run = self._attach(args)
        self._last, self._last_class, self._best, self._demote = None, None, None, []
        resumed = self._look_back(run, int(state.global_step))
        changes: dict[str, Any] = {}
        if run.status != "active":
            changes["status"] = "active"  # a job trains on it again
        if resumed is not None and run.resumed_from != resumed.id:
            changes["resumed_from"] = resumed.id
        if changes:
            try:
                body = run.client.call("PATCH", f"/v1/runs/{segment(run.id)}", json=changes)
                run._update(body)
            except CatalogError as error:
                log.warning(
                    "could not update run %s/%s (%s): %s", run.project, run.name, changes, error
                )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self._run is None:
            return
        step = int(state.global_step)
        path = Path(args.output_dir) / f"{PREFIX}-{step}"
        if not path.is_dir():  # a hyperparameter search's trial writes elsewhere
            log.warning("no %s after the save of step %d: not registered", path, step)
            return
        metrics, measured_at = latest_eval_metrics(state.log_history)
        value = metrics.get(self._metric) if self._metric and measured_at == step else None
        best = value is not None and self._beats(value)
        if control.should_training_stop:  # the last save: final, even if it must be spooled
            cls = "final"
        else:
            cls = "milestone" if best or self._scheduled(step) else "rolling"
        save = _Save(step, path, cls, manifest(path), metrics)
        if best and value is not None:
            save.former, self._best = self._best, _Best(step, value, cls, None)
            save.best = self._best
        self._courier.submit(partial(self._register, save))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self._run is None:
            return
        self._courier.close()  # every save registered (or spooled) first
        run = self._run
        # The last save is final already when the Trainer stopped right after it; else
        # (`save_strategy="best"`, a job resumed with nothing left to train) it is promoted.
        if self._last_class != "final":
            self._promote_last(run)
        try:
            run.complete()  # spooled if the service is away
        except CatalogError as error:
            log.error("the catalog refused to end run %s/%s: %s", run.project, run.name, error)
        if self._owns_client:  # a next train() attaches again, through a client of its own
            run.client.close()
            self._client = None

    # --- beneath ---------------------------------------------------------------------------

    def _attach(self, args: Any) -> Run:
        if self._client is None:
            self._client, self._run = Client(), None
        _check_under_a_tier(self._client, Path(args.output_dir))  # before a run is made
        if self._run is None:
            self._run = self._client.run(
                self.project, self.run_name, labels=self._labels, policy=self._policy
            )
        return self._run

    def _register(self, save: _Save) -> None:
        """One save's registration, in the worker thread."""
        run = self._run
        assert run is not None
        labels = {BEST_LABEL: str(self._metric)} if save.best is not None else None
        try:
            checkpoint = run.register(
                save.step,
                save.path,
                cls=save.cls,
                files=save.files,
                metrics=save.metrics,
                labels=labels,
            )
        except CatalogError as error:  # a refusal: the checkpoint stays, uncatalogued
            log.error("the catalog refused step %d (%s): %s", save.step, save.path, error)
            return
        self._last, self._last_class = checkpoint, save.cls
        if save.best is not None and checkpoint is not None:
            save.best.checkpoint_id = checkpoint.id
        if save.former is not None:
            self._demote.append(save.former)
        if checkpoint is not None:  # the service answers: the former bests can go back
            self._demote_former_bests()

    def _promote_last(self, run: Run) -> None:
        try:
            # a registration still in the spool is sent first by this call
            last = self._last if self._last is not None else run.latest()
            if last is not None and last.cls != "final":
                self._last = run.client.update_checkpoint(last.id, cls="final")
                self._last_class = "final"
        except CatalogError as error:
            log.warning(
                "the last checkpoint of %s/%s could not be made final: %s",
                run.project,
                run.name,
                error,
            )

    def _scheduled(self, step: int) -> bool:
        every = self.milestone_every_n_steps
        return every is not None and step % every == 0

    def _beats(self, value: float) -> bool:
        if self._best is None:
            return True
        return value > self._best.value if self._greater else value < self._best.value

    def _look_back(self, run: Run, step: int) -> Checkpoint | None:
        """When training starts from a checkpoint (`step` > 0): the run's checkpoint of that
        step, and the best so far (the active checkpoint labelled with the metric)."""
        if step <= 0:
            return None
        resumed: Checkpoint | None = None
        for checkpoint in run.checkpoints(state="active"):  # newest first
            if checkpoint.step == step:
                resumed = checkpoint
            labelled = checkpoint.labels.get(BEST_LABEL) == self._metric
            if self._metric and labelled and self._best is None:
                value = checkpoint.metrics.get(self._metric)
                if value is not None:
                    self._best = _Best(checkpoint.step, value, checkpoint.cls, checkpoint.id)
            if checkpoint.step <= step and (self._best is not None or not self._metric):
                break
        return resumed

    def _demote_former_bests(self) -> None:
        run = self._run
        while self._demote and run is not None:
            former = self._demote[0]
            try:
                checkpoint_id = former.checkpoint_id or _id_of_step(run, former.step)
                # a milestone for being the best goes back to rolling; one by step, or the
                # final, keeps its class
                back = former.cls == "milestone" and not self._scheduled(former.step)
                if checkpoint_id is not None:
                    run.client.update_checkpoint(
                        checkpoint_id, cls="rolling" if back else None, labels={BEST_LABEL: None}
                    )
            except Unavailable:
                return  # tried again after the next save the service answers
            except CatalogError as error:  # deleted meanwhile, say: nothing left to demote
                log.warning("step %d stays labelled best: %s", former.step, error)
            self._demote.pop(0)


def _best_metric(name: str | None, greater: bool | None) -> tuple[str | None, bool]:
    """The metric's name as it appears in the log (`eval_` prefixed, as the Trainer reads
    `metric_for_best_model`) and its direction (the Trainer's default: higher is better
    unless the name ends in `loss`)."""
    if not name:
        return None, False
    key = name if name.startswith("eval_") else f"eval_{name}"
    return key, (not key.endswith("loss")) if greater is None else bool(greater)


def latest_eval_metrics(
    log_history: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, float], int | None]:
    """The `eval_*` numbers of the newest evaluation in `state.log_history`, and the step it
    was made at (({}, None) before the first one). Non-finite values are left out: the
    catalog stores finite numbers only."""
    for entry in reversed(log_history):
        found = {
            str(key): float(value)
            for key, value in entry.items()
            if str(key).startswith("eval_")
            and len(str(key)) <= METRIC_KEY_LIMIT
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        }
        if found:
            step = entry.get("step")
            chosen = dict(sorted(found.items())[:METRICS_LIMIT])
            return chosen, int(step) if isinstance(step, (int, float)) else None
    return {}, None


def _check_under_a_tier(client: Client, output_dir: Path) -> None:
    """Refuse, before training, an `output_dir` that lies under none of the service's local
    tiers: every registration would be refused (the service reads the checkpoints there)."""
    tiers = client.tiers()  # `Unavailable` past the deadline, as creating the run would be
    target = Path(os.path.abspath(output_dir))
    local = [t for t in tiers if t.local_path is not None]
    if any(target == t.local_path or t.local_path in target.parents for t in local):
        return
    raise ValueError(
        f"output_dir {target} lies under none of the catalog's local tiers "
        f"({', '.join(f'{t.name}: {t.local_path}' for t in local) or 'it has none'}): the "
        "service could not read the checkpoints written there"
    )


def _id_of_step(run: Run, step: int) -> str | None:
    for checkpoint in run.checkpoints():
        if checkpoint.step == step:
            return checkpoint.id
        if checkpoint.step < step:
            break
    return None
