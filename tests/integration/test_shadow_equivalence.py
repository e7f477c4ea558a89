"""A shadow policy records what the same policy does when enforced.

Two services on two databases live the same 36 days, driven through the API with the
clock moved in process (time_machine): runs registering rolling, daily and milestone
checkpoints with their `created_at`, runs ending, a run resuming from another, a pin, and
a restore of a checkpoint the candidate would have deleted. On the first the candidate
policy is in shadow mode beside a policy in force that leaves alone what it looks at; on
the second it is enforced, its deletes approved when held and every action carried out as
soon as it is planned. The shadow ledger of the first is then the ledger of the second,
action for action and instant for instant; the first made no storage call for any of it;
and its report names the restored checkpoint as a regret with the right dates."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.db.models import Base
from app.db.session import make_engine
from app.domain.tier import Tier
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from app.storage.base import Storage
from app.storage.registry import StorageRegistry
from tests.builders import (
    checkpoint_post,
    end_run,
    iso,
    ledger,
    make_executor,
    place_checkpoint,
    put_policy,
    step_files,
)
from tests.conftest import migrated_database
from tests.integration.shadow_world import (
    evaluate_requested,
    periodic_sweep,
    priced,
    shadow,
    shadow_rows,
)

START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
DAYS = 36

# In force on the shadowed service: old debug checkpoints go, exports get a copy on warm.
# Neither is a class the candidate looks at.
IN_FORCE = """\
name: default
rules:
  - {name: debug-keep-1, class: debug, keep_last: 1, action: delete}
  - {name: export-warm, class: export, action: {copy_to: warm}}
"""

CANDIDATE = """\
name: candidate
mode: {mode}
applies_to: {{projects: [proj]}}
priority: 10
rules:
  - {{name: rolling-keep-3, class: rolling, keep_last: 3, action: delete}}
  - {{name: daily-thin, class: daily, when: {{age: 1d}}, keep_daily: 3, keep_weekly: 2,
      action: delete}}
  - name: milestones-thin
    class: milestone
    when: {{run_ended: 5d}}
    keep_best: {{metric: eval_loss, mode: min, count: 2}}
    keep_last: 1
    action: delete
  - {{name: milestones-warm, class: milestone, when: {{age: 3d}}, action: {{move_to: warm}}}}
  - name: milestones-cold
    class: milestone
    when: {{age: 10d, on_tier: [warm]}}
    action: {{move_to: cold}}
  # due the moment a milestone lands on warm: evaluated again at once, as an enforced
  # policy is when its move is done
  - {{name: warm-copies, class: milestone, when: {{on_tier: [warm]}}, action: {{copy_to: archive}}}}
  - {{name: final-archive, class: final, when: {{run_ended: 0s}}, action: {{copy_to: archive}}}}
"""

STORAGE_METHODS = (
    "list_prefix",
    "iter_prefix",
    "prefix_exists",
    "head",
    "open_read",
    "read_small",
    "upload",
    "copy_within",
    "set_storage_class",
    "delete_keys",
    "delete_prefix",
    "abort_uploads",
    "restore_state",
    "request_restore",
)


class CountingRegistry(StorageRegistry):
    """The adapters of the tiers, each method call recorded with the phase of the test it
    was made in: the storage boundary, seen from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "api"
        self.calls: list[tuple[str, str, str, str]] = []  # phase, tier path, method, key
        self._wrapped: set[int] = set()

    def storage_for(self, tier: Tier) -> Storage:
        adapter = super().storage_for(tier)
        if id(adapter) not in self._wrapped:
            self._wrapped.add(id(adapter))
            for name in STORAGE_METHODS:
                method = getattr(adapter, name, None)
                if method is not None:
                    setattr(adapter, name, self._counted(tier.name, name, method))
        return adapter

    def _counted(self, tier: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((self.phase, tier, name, str(args[0]) if args else ""))
            return method(*args, **kwargs)

        return counted


@pytest.fixture(scope="module")
def twin_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second database of the same kind as the suite's."""
    kind = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    yield from migrated_database(kind, tmp_path_factory)


@pytest.fixture
def twin_engine(twin_url: str) -> Iterator[Engine]:
    engine = make_engine(twin_url)
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(text(f"DELETE FROM {table.name}"))
    yield engine
    engine.dispose()


@dataclass
class Service:
    """One of the two services, and the checkpoints it registered by (run, step)."""

    app: FastAPI
    client: TestClient
    data_dir: Path
    storages: CountingRegistry
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ids: dict[tuple[str, int], str] = field(default_factory=dict)

    def settle(self, now: datetime) -> None:
        """Evaluate as the service would at `now` (the registration's evaluations, then the
        periodic sweep), approve what is held, carry everything out, and again until
        nothing more happens: an enforced policy's actions all done at `now`."""
        worker = make_executor(self.app)
        for _ in range(10):
            self.storages.phase = "evaluate"
            evaluate_requested(self.app, now)
            periodic_sweep(self.app, now)
            self.storages.phase = "api"
            for held in ledger(self.client, state="held"):
                approved = self.client.post(f"/v1/actions/{held['id']}/approve")
                assert approved.status_code == 200, approved.text
            self.storages.phase = "drain"
            done = worker.drain()
            self.storages.phase = "api"
            if done == 0:
                return
        pytest.fail("the service never settled")


def service(settings: Settings, engine: Engine, data_dir: Path) -> Iterator[Service]:
    storages = CountingRegistry()
    app = create_app(
        priced(settings.model_copy(update={"data_dir": data_dir})),
        engine=engine,
        roles=NO_BACKGROUND,
        storages=storages,
    )
    with TestClient(app) as client:
        yield Service(app, client, data_dir, storages)


@pytest.fixture
def shadowed(settings: Settings, clean_engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(settings, clean_engine, tmp_path / "shadowed" / "data")


@pytest.fixture
def enforced(settings: Settings, twin_engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(settings, twin_engine, tmp_path / "enforced" / "data")


Event = Callable[[Service], None]


def schedule() -> list[tuple[datetime, Event]]:
    """The 36 days: (when, what happens to a service then)."""
    rng = random.Random(20260302)
    events: list[tuple[datetime, Event]] = []
    runs = {"run-1": (0, 20), "run-2": (10, 31)}  # start day, end day

    def start(name: str, day: int) -> Event:
        def do(s: Service) -> None:
            body: dict[str, Any] = {"project": "proj", "name": name, "started_at": iso(at(day))}
            if name == "run-2":  # resumed from run-1's newest save
                body["resumed_from"] = s.ids["run-1", max(k[1] for k in s.ids if k[0] == "run-1")]
            response = s.client.post("/v1/runs", json=body)
            assert response.status_code == 201, response.text
            s.runs[name] = response.json()

        return do

    def save(name: str, step: int, klass: str, moment: datetime, loss: float) -> Event:
        def do(s: Service) -> None:
            made = place_checkpoint(
                s.client,
                s.data_dir,
                s.runs[name],
                step,
                klass,
                files=step_files(step, size=50 + step % 7),
                created_at=moment,
                metrics={"eval_loss": loss},
            )
            s.ids[name, step] = made["id"]

        return do

    def end(name: str, moment: datetime) -> Event:
        def do(s: Service) -> None:
            end_run(s.client, s.runs[name]["id"], moment)

        return do

    def pin(name: str, step: int) -> Event:
        def do(s: Service) -> None:
            pinned = checkpoint_post(s.client, s.ids[name, step], "pin", {"reason": "paper"})
            assert pinned.status_code == 200, pinned.text

        return do

    for name, (first, last) in runs.items():
        events.append((at(first), start(name, first)))
        for day in range(first, last):
            for hour, klass in ((3, "rolling"), (9, "debug"), (12, "daily"), (15, "rolling")):
                moment = at(day, hour)
                step = (day - first) * 24 + hour
                events.append((moment, save(name, step, klass, moment, 0)))
            if day % 4 == 0:
                moment = at(day, 18)
                step = (day - first) * 24 + 18
                events.append((moment, save(name, step, "export", moment, 0)))
            moment = at(day, 23)
            step = (day - first) * 24 + 23
            loss = round(rng.uniform(0.5, 2.0), 3)
            events.append((moment, save(name, step, "milestone", moment, loss)))
        final_at = at(last, 1)
        final_step = (last - first) * 24 + 1
        events.append((final_at, save(name, final_step, "final", final_at, 0)))
        events.append((at(last, 2), end(name, at(last, 2))))
    # a person pins a milestone of run-1 (day 6's) before it would move
    events.append((at(8, 7), pin("run-1", 6 * 24 + 23)))
    return sorted(events, key=lambda e: e[0])


def at(day: int, hour: int = 0) -> datetime:
    return START + timedelta(days=day, hours=hour)


def candidate_ledger(s: Service) -> list[tuple[str, int, str, str | None, str | None, str, str]]:
    """The candidate's real actions: (run, step, kind, from, to, rule, created_at)."""
    names = {r["id"]: n for n, r in s.runs.items()}
    steps = {cid: key[1] for key, cid in s.ids.items()}
    return sorted(
        (
            names[a["run_id"]],
            steps[a["checkpoint_id"]],
            a["kind"],
            a["from_tier"],
            a["to_tier"],
            a["rule"],
            a["created_at"],
        )
        for a in ledger(s.client)
        if a["rule"].startswith("candidate/")
    )


def test_the_shadow_ledger_is_the_ledger_of_the_policy_enforced(
    shadowed: Service, enforced: Service
) -> None:
    put_policy(shadowed.client, IN_FORCE)
    put_policy(shadowed.client, CANDIDATE.format(mode="shadow"))
    put_policy(enforced.client, IN_FORCE)
    put_policy(enforced.client, CANDIDATE.format(mode="enforce"))
    events = schedule()
    ticks = [at(day, hour) for day in range(DAYS) for hour in (0, 6, 12, 18)]
    timeline: list[tuple[datetime, Event | None]] = sorted(
        [*[(moment, None) for moment in ticks], *events], key=lambda item: item[0]
    )  # stable: at one moment the sweep's tick comes first
    restored: dict[str, Any] = {}
    with time_machine.travel(START, tick=False) as traveller:
        for moment, event in timeline:
            traveller.move_to(moment)
            for s in (shadowed, enforced):
                if event is not None:
                    event(s)
                s.settle(moment)
            if (
                moment == at(25, 6) and event is None
            ):  # and restores a rolling save the candidate deletes
                restored = restore_one(shadowed, enforced, moment)

    real = candidate_ledger(enforced)
    recorded = shadow_ledger(shadowed)
    assert len(real) > 100
    assert {k[2] for k in real} == {"delete", "move", "copy"}
    assert {k[4] for k in real if k[2] == "move"} == {"warm", "cold"}
    assert recorded == real
    # nothing carried out on the shadowed service: its candidate has no real action
    assert candidate_ledger(shadowed) == []
    regrets = shadow(shadowed.client)["regrets"]
    assert [(r["checkpoint_id"], r["use"]) for r in regrets] == [
        (restored["checkpoint_id"], "restored")
    ]
    assert regrets[0]["would_delete_at"] == restored["would_delete_at"]
    assert regrets[0]["used_at"] == restored["created_at"]
    assert_no_storage_call_for_shadow_actions(shadowed, enforced)


def restore_one(shadowed: Service, enforced: Service, moment: datetime) -> dict[str, Any]:
    """Restore to warm the oldest rolling save of run-2 that the candidate deleted: on the
    shadowed service it is still there (202); on the other it is gone (409)."""
    deleted = [
        r
        for r in shadow_rows(shadowed.app)
        if r.kind == "delete" and r.rule == "candidate/rolling-keep-3"
    ]
    victim = min(
        (r for r in deleted if r.run_id == shadowed.runs["run-2"]["id"]), key=lambda r: r.step
    )
    response = shadowed.client.post(
        f"/v1/checkpoints/{victim.checkpoint_id}/restore", json={"tier": "warm"}
    )
    assert response.status_code == 202, response.text
    twin = enforced.ids["run-2", victim.step]
    assert (
        enforced.client.post(f"/v1/checkpoints/{twin}/restore", json={"tier": "warm"}).status_code
        == 409
    )
    shadowed.settle(moment)
    return {
        "checkpoint_id": victim.checkpoint_id,
        "would_delete_at": iso(victim.created_at),
        "created_at": response.json()["created_at"],
    }


def shadow_ledger(s: Service) -> list[tuple[str, int, str, str | None, str | None, str, str]]:
    names = {r["id"]: n for n, r in s.runs.items()}
    return sorted(
        (
            names[a["run_id"]],
            a["step"],
            a["kind"],
            a["from_tier"],
            a["to_tier"],
            a["rule"],
            a["created_at"],
        )
        for a in shadow(s.client)["actions"]
    )


def assert_no_storage_call_for_shadow_actions(shadowed: Service, enforced: Service) -> None:
    """No evaluation touches storage, and the shadowed service's workers touched only the
    checkpoints its own actions (the policy in force's copies, the restore) were about:
    none that only the candidate's would-be actions concern."""
    for s in (shadowed, enforced):
        assert [c for c in s.storages.calls if c[0] == "evaluate"] == []
    by_id = {cid: key for key, cid in shadowed.ids.items()}
    acted = {by_id[a["checkpoint_id"]] for a in ledger(shadowed.client) if a["kind"] != "delete"}
    touched = [(c, checkpoints_in(c[3])) for c in shadowed.storages.calls if c[0] == "drain"]
    assert touched, "the policy in force's copies and the restore made storage calls"
    assert [c for c, found in touched if not found or not found <= acted] == []
    shadow_only = {by_id[r.checkpoint_id] for r in shadow_rows(shadowed.app)} - acted
    assert len(shadow_only) > 50
    assert [c for c, found in touched if found & shadow_only] == []
    # the counter does see what an enforced candidate does: its moves and copies
    moved = {(k[0], k[1]) for k in candidate_ledger(enforced) if k[2] in ("move", "copy")}
    seen = set().union(*(checkpoints_in(c[3]) for c in enforced.storages.calls if c[0] == "drain"))
    assert moved and moved <= seen


def checkpoints_in(key: str) -> set[tuple[str, int]]:
    """The (run, step) of every checkpoint directory a storage call's argument names."""
    return {(run, int(step)) for run, step in re.findall(r"proj/(run-\d+)/step-(\d+)\b", key)}
