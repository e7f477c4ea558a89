"""Safety invariant 1 as a property: whatever jobs register (directories inside directories,
single files beside each other, the same place twice), whatever people delete and policies
move, and even with overlaps written into the catalog behind the API's back (a catalog from
before locations were kept apart), no checkpoint that nobody deleted loses a byte."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from app.db.models import Checkpoint, Location
from app.db.session import session_scope
from tests.builders import ago, end_run, iso, make_executor, put_policy, sweep_now

# A small tree: names ending in .ckpt are single files, the others directories.
PLACES = ("a", "a/b", "a/b/c", "a/b/f.ckpt", "a/g.ckpt", "a/h.ckpt", "e", "e/x")
POLICY = """\
name: default
rules:
  - name: milestones-cold
    class: milestone
    when: {run_ended: 0s}
    action: {move_to: cold}
"""

op = st.one_of(
    st.tuples(st.just("register"), st.integers(0, len(PLACES) - 1), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 7)),
    st.tuples(st.just("end"), st.integers(0, 7)),
    st.tuples(st.just("alias"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("sweep")),
)


class World:
    def __init__(self, client: TestClient, app: FastAPI, data_dir: Path) -> None:
        self.client, self.app = client, app
        self.tag = uuid.uuid4().hex[:10]  # examples share one catalog: their own names
        self.root = data_dir / "hot" / self.tag
        self.made: list[dict[str, Any]] = []
        self.registrations = 0

    def write(self, place: str) -> str:
        path = self.root / place
        if place.endswith(".ckpt"):
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_bytes(f"{place} weights".encode() * 20)
        else:
            path.mkdir(parents=True, exist_ok=True)
            shard = path / f"shard-{self.registrations}.bin"
            shard.write_bytes(f"{place} {self.registrations}".encode() * 20)
        return f"file://{path}"

    def register(self, place: str, milestone: bool) -> None:
        self.registrations += 1
        n = self.registrations
        run = self.client.post(
            "/v1/runs",
            json={"project": f"p{self.tag}-{n}", "name": "r", "started_at": iso(ago(days=30))},
        ).json()
        body = {
            "step": n,
            "class": "milestone" if milestone else "rolling",
            "uri": self.write(place),
            "created_at": iso(ago(days=2)),
        }
        response = self.client.post(f"/v1/runs/{run['id']}/checkpoints", json=body)
        assert response.status_code in (201, 409), response.text
        if response.status_code == 201:
            self.made.append(response.json())

    def pick(self, index: int) -> dict[str, Any] | None:
        return self.made[index % len(self.made)] if self.made else None

    def alias(self, i: int, j: int) -> None:
        """Make checkpoint i a second catalogue entry of j's bytes, behind the API."""
        one, other = self.pick(i), self.pick(j)
        if one is None or other is None or one["id"] == other["id"]:
            return
        with session_scope(self.app.state.session_factory) as session:
            source = session.execute(
                select(Checkpoint).where(Checkpoint.id == other["id"])
            ).scalar_one()
            if source.state not in ("active", "trashed"):
                return
            uri = session.execute(
                select(Location.uri).where(
                    Location.checkpoint_id == other["id"], Location.role == "primary"
                )
            ).scalar_one()
            values: dict[str, Any] = {
                "uri": uri,
                "files": source.files,
                "single_file": source.single_file,
            }
            values["size_bytes"] = source.size_bytes
            session.execute(update(Checkpoint).where(Checkpoint.id == one["id"]).values(values))
            session.execute(
                update(Location).where(Location.checkpoint_id == one["id"]).values(uri=uri)
            )

    def apply(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "register":
            self.register(PLACES[step[1]], step[2])
        elif kind == "delete" and (target := self.pick(step[1])) is not None:
            answer = self.client.delete(f"/v1/checkpoints/{target['id']}")
            assert answer.status_code in (202, 409), answer.text
        elif kind == "end" and (target := self.pick(step[1])) is not None:
            end_run(self.client, target["run_id"], ago(days=1))
        elif kind == "alias":
            self.alias(step[1], step[2])
        elif kind == "sweep":
            sweep_now(self.client)
        make_executor(self.app, trash_retention=timedelta(0)).drain()

    def losses(self) -> list[str]:
        """Files of live checkpoints that are not where the catalog says, as catalogued."""
        lost = []
        with session_scope(self.app.state.session_factory) as session:
            rows = session.execute(
                select(Checkpoint.id, Checkpoint.files, Checkpoint.single_file, Location.uri)
                .join(Location, Location.checkpoint_id == Checkpoint.id)
                .where(
                    Checkpoint.state.in_(("active", "trashed")),
                    Checkpoint.id.in_([c["id"] for c in self.made]),
                )
            ).all()
        for checkpoint_id, files, single_file, uri in rows:
            base = Path(uri.removeprefix("file://"))
            for entry in files or []:
                path = base if single_file else base / entry["path"]
                data = path.read_bytes() if path.is_file() else None
                if data is None or len(data) != entry["size_bytes"]:
                    lost.append(f"{checkpoint_id}: {path}")
                elif "sha256" in entry and hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    lost.append(f"{checkpoint_id}: {path} changed")
        return lost


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(op, min_size=1, max_size=14))
def test_no_live_checkpoint_ever_loses_a_byte(
    client: TestClient, app: FastAPI, data_dir: Path, steps: list[tuple[Any, ...]]
) -> None:
    put_policy(client, POLICY)
    world = World(client, app, data_dir)
    for step in steps:
        world.apply(step)
        assert world.losses() == [], (step, steps)
