""" "A `writing` checkpoint is invisible to every rule", against the race training
frameworks keep shipping: the asynchronous save of step N+1 is in flight (reserved,
`writing`, its first shards on disk) while step N commits and the rolling policy prunes.

Hypothesis interleaves reservations, partial and full writes, commits (with a manifest or
listed by the service), aborts, keepalives, sweeps drained by a worker that purges at once,
and the scheduler's abandonment check at any clock. After every step:

- the resume point, the newest step that committed, is `active` with all its bytes;
- no byte a reservation has written is gone, nor has its location moved, so its commit
  still finds what it needs;
- a commit of a live reservation always succeeds;
- the bytes of an aborted save are gone once it is purged, and no one else's with them.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.db.session import session_scope
from app.scheduler.runtime import Runtime
from app.services.lifecycle.trash import enqueue_due_purges
from tests.builders import ago, file_entries, iso, make_executor, put_policy, step_files

POLICY = """\
name: default
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
"""
SHARDS = 3

op = st.one_of(
    st.tuples(st.just("reserve")),  # the next step's save starts
    st.tuples(st.just("write"), st.integers(0, 7)),  # one more shard of a save lands
    st.tuples(st.just("commit"), st.integers(0, 7), st.booleans()),  # listed by the service?
    st.tuples(st.just("abort"), st.integers(0, 7)),
    st.tuples(st.just("keepalive"), st.integers(0, 7)),
    st.tuples(st.just("sweep")),  # evaluate the run, drain the worker (trash period 0s)
    st.tuples(st.just("abandon"), st.integers(0, 3)),  # the scheduler, 0-3 TTLs from now
)


@dataclass
class Save:
    step: int
    id: str
    root: Path
    written: dict[str, bytes] = field(default_factory=dict)
    state: str = "writing"  # what the job was told: writing, committed or aborted


class World:
    def __init__(self, client: TestClient, app: FastAPI, data_dir: Path) -> None:
        self.client, self.app = client, app
        name = f"r{uuid.uuid4().hex[:10]}"  # the examples share one catalog
        self.run = client.post(
            "/v1/runs", json={"project": "race", "name": name, "started_at": iso(ago(days=3))}
        ).json()
        self.base = data_dir / "hot" / "race" / name
        self.saves: list[Save] = []
        self.ttl: timedelta = app.state.settings.reservation_ttl

    def pick(self, index: int, state: str = "writing") -> Save | None:
        live = [s for s in self.saves if s.state == state]
        return live[index % len(live)] if live else None

    def reserve(self) -> None:
        step = 100 * (len(self.saves) + 1)
        root = self.base / f"step-{step}"
        body = {
            "step": step,
            "class": "rolling",
            "uri": f"file://{root.resolve()}",
            "committed": False,
            "created_at": iso(ago(hours=1)),
        }
        response = self.client.post(f"/v1/runs/{self.run['id']}/checkpoints", json=body)
        assert response.status_code == 201, response.text
        self.saves.append(Save(step, response.json()["id"], root))

    def write(self, save: Save) -> None:
        files = step_files(save.step, SHARDS)
        missing = [name for name in sorted(files) if name not in save.written]
        if missing:
            save.root.mkdir(parents=True, exist_ok=True)
            (save.root / missing[0]).write_bytes(files[missing[0]])
            save.written[missing[0]] = files[missing[0]]

    def commit(self, save: Save, listed: bool) -> None:
        while len(save.written) < SHARDS:
            self.write(save)
        body = None if listed else {"files": file_entries(save.written)}
        response = self.client.post(f"/v1/checkpoints/{save.id}/commit", json=body)
        assert response.status_code == 200, response.text  # nothing it needs went missing
        assert response.json()["state"] == "active"
        save.state = "committed"

    def abort(self, save: Save) -> None:
        response = self.client.post(f"/v1/checkpoints/{save.id}/abort", json={"reason": "test"})
        assert response.status_code == 200, response.text
        save.state = "aborted"

    def sweep(self) -> None:
        response = self.client.post("/v1/sweeps", json={"run_id": self.run["id"]})
        assert response.status_code == 202, response.text
        self.drain()

    def abandon(self, ttls: int) -> None:
        runtime: Runtime = self.app.state.runtime
        clock = datetime.now(UTC) + ttls * self.ttl + timedelta(seconds=1)
        aborted = set(runtime.abandon(now=clock))
        for save in self.saves:
            if save.id in aborted:
                assert save.state == "writing", save
                save.state = "aborted"
        self.drain()

    def drain(self) -> None:
        factory = self.app.state.session_factory
        with session_scope(factory) as session:  # the purge job, trash period over
            enqueue_due_purges(session, retention=timedelta(0), now=datetime.now(UTC))
        make_executor(self.app, trash_retention=timedelta(0)).drain()

    def apply(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "reserve":
            self.reserve()
        elif kind == "sweep":
            self.sweep()
        elif kind == "abandon":
            self.abandon(step[1])
        elif (save := self.pick(step[1])) is not None:
            if kind == "write":
                self.write(save)
            elif kind == "commit":
                self.commit(save, step[2])
            elif kind == "abort":
                self.abort(save)
            elif kind == "keepalive":
                response = self.client.post(f"/v1/checkpoints/{save.id}/keepalive")
                assert response.status_code == 200, response.text

    def checkpoint(self, save: Save) -> dict[str, Any]:
        response = self.client.get(f"/v1/checkpoints/{save.id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def check(self) -> None:
        for save in self.saves:
            now = self.checkpoint(save)
            if save.state == "writing":
                # invisible to every rule: still reserved where it was, no byte of it gone
                assert now["state"] == "writing", (save, now)
                assert [loc["uri"] for loc in now["locations"]] == [now["uri"]]
                assert now["uri"] == f"file://{save.root.resolve()}"
                assert intact(save.root, save.written), save
            elif save.state == "aborted":
                assert now["state"] in ("trashed", "deleted"), (save, now)
                if now["state"] == "deleted":
                    assert not save.root.exists(), save
        committed = [s for s in self.saves if s.state == "committed"]
        if committed:
            resume = max(committed, key=lambda s: s.step)
            now = self.checkpoint(resume)
            assert now["state"] == "active", (resume, now)
            assert intact(resume.root, step_files(resume.step, SHARDS)), resume


def intact(root: Path, files: dict[str, bytes]) -> bool:
    for name, data in files.items():
        path = root / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).digest() != (
            hashlib.sha256(data).digest()
        ):
            return False
    return True


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(op, min_size=1, max_size=16))
def test_a_save_in_flight_never_loses_the_resume_point_nor_its_own_bytes(
    client: TestClient, app: FastAPI, data_dir: Path, steps: list[tuple[Any, ...]]
) -> None:
    put_policy(client, POLICY)
    world = World(client, app, data_dir)
    for step in steps:
        world.apply(step)
        world.check()


def test_the_race_as_frameworks_ship_it(client: TestClient, app: FastAPI, data_dir: Path) -> None:
    """The one interleaving spelled out: N+1 reserved and half written, N commits, the
    policy prunes, N+1 commits, the policy prunes again."""
    put_policy(client, POLICY)
    world = World(client, app, data_dir)
    for step in (("reserve",), ("commit", 0, False), ("reserve",), ("write", 0)):
        world.apply(step)
    n, n_plus_1 = world.saves
    world.sweep()
    world.check()
    assert world.checkpoint(n)["state"] == "active"  # the resume point while N+1 is in flight

    world.commit(n_plus_1, listed=True)
    world.sweep()

    world.check()
    assert world.checkpoint(n)["state"] == "deleted"  # pruned only once N+1 committed
    assert world.checkpoint(n_plus_1)["state"] == "active"
