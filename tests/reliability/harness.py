"""Crash injection: kill a real worker process at every crash point an action reaches, start
a fresh worker, and check that nothing was lost (DESIGN section 8, invariants 2 and 3).

For one scenario (an action kind between two tiers) the harness

1. runs the action once without crashing, every worker process tracing the crash points it
   reaches (`CKPT_CRASH_TRACE`): that trace is the list of injection targets, so a new step
   with a crash point is covered without anyone listing it;
2. for each target, on a fresh catalog: runs the worker processes before it, then one with
   `CKPT_CRASH_AT=<point>#<n>`, which must die by SIGKILL exactly there; checks that the
   checkpoint is readable, bytes intact, from a catalogued location; then runs fresh workers
   (their clock past the dead one's lease) until the action is over, and checks the end:
   `done` (or, for a scenario built to fail, `failed` with the source as it was), the catalog
   as the action promises, and under the run's prefix on every tier nothing but the
   catalogued copies: no orphan, no temporary file, no unfinished multipart upload.

Bytes are read back from the tiers with independent clients (not our adapters) and compared
by sha256; an S3 object still in an archive class (unreadable until restored) is compared by
size and ETag (its MD5, for a single-request upload) instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import google_crc32c
import yaml
from google.api_core import exceptions as gcs_errors
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Action, Base, Checkpoint, Location
from app.db.session import make_session_factory, session_scope
from app.domain.tier import Tier
from app.services.catalog.checkpoints import Registration, register_checkpoint
from app.services.catalog.run_totals import add_active
from app.services.catalog.runs import create_run
from app.services.lifecycle.ledger import new_action, purge_action
from app.settings import Settings
from app.storage.registry import StorageRegistry
from app.tiers_config import load_tiers
from tests.figures import FIGURES
from tests.reliability.worker import WorkerJob, run_worker

if TYPE_CHECKING:
    from google.cloud import storage as gcs
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.literals import StorageClassType

KILLED = -9  # a child's exit code after SIGKILL
LEASE_PASSED = timedelta(seconds=61)  # each worker's clock is this much past the previous one's
MAX_PASSES = 8  # worker processes one action may need (restore polls, retries: 5 attempts)
TERMINAL = ("done", "failed", "cancelled")
ARCHIVED_S3_CLASSES = ("GLACIER", "DEEP_ARCHIVE")
ACTOR = "test:crash"
STEP = 10

# The harness's storage adapters (its tiers are local directories).
STORAGES = StorageRegistry()


# --- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One action: `kind` from the checkpoint's primary tier `source` to `target`; `replica`
    adds a second location first. `damage` makes it one that must fail: `corrupt` flips the
    bytes of a file (verification fails), `missing` removes it (no waiting brings it back:
    failed at once), `blocked` puts a file where the copy's directory goes (retried, then
    failed)."""

    kind: Literal["move", "copy", "restore", "delete", "purge"]
    source: str
    target: str | None = None
    replica: str | None = None
    files: int = 2
    damage: Literal["corrupt", "missing", "blocked"] | None = None

    @property
    def id(self) -> str:
        where = self.source if self.target is None else f"{self.source}->{self.target}"
        if self.replica is not None:
            where += f"+{self.replica}"
        return f"{self.kind}{'-' + self.damage if self.damage else ''}:{where}"

    @property
    def outcome(self) -> str:
        return "failed" if self.damage else "done"


# Every action kind on local tiers, and two moves built to fail (verification, a missing file).
LOCAL_SCENARIOS = [
    Scenario("move", "hot", "cold"),
    Scenario("copy", "hot", "cold"),
    Scenario("restore", "cold", "hot"),
    Scenario("delete", "hot"),
    Scenario("purge", "hot", replica="cold"),
    Scenario("move", "hot", "cold", files=1, damage="corrupt"),
    Scenario("move", "hot", "cold", damage="missing"),  # one of two files: a partial copy
    Scenario("move", "hot", "cold", damage="blocked"),
]
# Across providers (the tiers of the `object_world` fixture).
S3_SCENARIOS = [
    *(Scenario(kind, "hot", "s3") for kind in ("move", "copy", "restore")),
    Scenario("move", "s3", "s3ia"),  # one bucket prefix, two classes: changed in place
    Scenario("purge", "s3", replica="gcs"),
]
GCS_SCENARIOS = [
    *(Scenario(kind, "glacier", "gcs") for kind in ("move", "copy", "restore")),
    *(Scenario(kind, "gcs", "hot") for kind in ("move", "copy", "restore")),
]
# On PostgreSQL too (the claim of a dead worker's action takes another path there): one
# scenario per function of the executor.
POSTGRES_SCENARIOS = [
    Scenario("move", "hot", "cold"),
    Scenario("delete", "hot"),
    Scenario("purge", "hot", replica="cold"),
]
# Between them these reach every declared crash point (test_crash_coverage.py checks it).
COVERAGE_SCENARIOS = [
    Scenario("move", "hot", "cold"),
    Scenario("delete", "hot"),
    Scenario("purge", "hot", replica="cold"),
    Scenario("move", "hot", "cold", files=1, damage="corrupt"),
    Scenario("move", "hot", "cold", damage="missing"),  # one of two files: a partial copy
    Scenario("move", "hot", "cold", damage="blocked"),
    Scenario("move", "glacier", "gcs"),
    Scenario("move", "s3", "s3ia"),
]


# --- tiers ----------------------------------------------------------------------------------


@dataclass
class World:
    """The tiers a matrix runs on, and independent clients to look at their objects."""

    root: Path
    tiers_file: Path
    tiers: dict[str, Tier]
    s3: S3Client | None = None
    gcs: gcs.Client | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def child_env(self) -> dict[str, str]:
        """Provider endpoints and the test servers' credentials, for the worker processes."""
        return {
            k: v for k, v in os.environ.items() if k.startswith("AWS_") or k.startswith("STORAGE_")
        }


def make_world(
    root: Path,
    object_tiers: list[dict[str, Any]] | None = None,
    *,
    s3: S3Client | None = None,
    gcs_client: gcs.Client | None = None,
) -> World:
    """`hot` and `cold` local directories under `root`, then `object_tiers` (tiers file
    entries)."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    local = [{"name": name, "url": f"file://{root / 'tiers' / name}"} for name in ("hot", "cold")]
    tiers_file = root / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump({"tiers": local + (object_tiers or [])}))
    settings = Settings(data_dir=root / "data", tiers_file=tiers_file, auth="off")
    tiers = {tier.name: tier for tier in load_tiers(settings)}
    return World(root, tiers_file, tiers, s3=s3, gcs=gcs_client)


# --- objects on the tiers, seen without our adapters ------------------------------------------


@dataclass(frozen=True)
class Archived:
    """An S3 object in an archive class: its bytes cannot be read before a restore."""

    size: int
    etag: str


def _object_uri(location_uri: str, path: str) -> str:
    return f"{location_uri.rstrip('/')}/{path}"


def _split(uri: str) -> tuple[str, str, str]:
    scheme, rest = uri.split("://", 1)
    if scheme == "file":
        return scheme, "", rest
    bucket, _, key = rest.partition("/")
    return scheme, bucket, key


def put_object(world: World, tier: Tier, uri: str, data: bytes) -> None:
    scheme, bucket, key = _split(uri)
    if scheme == "file":
        Path(key).parent.mkdir(parents=True, exist_ok=True)
        Path(key).write_bytes(data)
    elif scheme == "s3":
        assert world.s3 is not None
        world.s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=data,
            StorageClass=cast("StorageClassType", tier.storage_class or "STANDARD"),
        )
    else:
        assert world.gcs is not None
        blob = world.gcs.bucket(bucket).blob(key)
        if tier.storage_class:
            blob.storage_class = tier.storage_class
        blob.upload_from_string(data)


def delete_object(world: World, uri: str) -> None:
    scheme, bucket, key = _split(uri)
    if scheme == "file":
        Path(key).unlink()
    elif scheme == "s3":
        assert world.s3 is not None
        world.s3.delete_object(Bucket=bucket, Key=key)
    else:
        assert world.gcs is not None
        world.gcs.bucket(bucket).blob(key).delete()


def read_object(world: World, uri: str) -> bytes | Archived | None:
    """The object's bytes; Archived when S3 holds it unrestored; None when it is missing."""
    scheme, bucket, key = _split(uri)
    if scheme == "file":
        path = Path(key)
        return path.read_bytes() if path.is_file() else None
    if scheme == "s3":
        assert world.s3 is not None
        try:
            head = world.s3.head_object(Bucket=bucket, Key=key)
        except world.s3.exceptions.ClientError as error:
            if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        restored = 'ongoing-request="false"' in head.get("Restore", "")
        if head.get("StorageClass") in ARCHIVED_S3_CLASSES and not restored:
            return Archived(head["ContentLength"], head["ETag"].strip('"'))
        body: bytes = world.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body
    assert world.gcs is not None
    try:
        data: bytes = world.gcs.bucket(bucket).blob(key).download_as_bytes()
    except gcs_errors.NotFound:
        return None
    return data


def _roots(world: World) -> set[tuple[str, str, str]]:
    return {(t.parsed.scheme, t.parsed.bucket, t.parsed.path) for t in world.tiers.values()}


def objects_under(world: World, project: str) -> set[str]:
    """The uri of every object, temporary files included, under `<tier>/<project>/` on
    every tier."""
    found: set[str] = set()
    for scheme, bucket, path in _roots(world):
        prefix = f"{path}/{project}/" if path else f"{project}/"
        if scheme == "file":
            base = Path(path) / project
            found.update(f"file://{p}" for p in base.rglob("*") if not p.is_dir())
        elif scheme == "s3":
            assert world.s3 is not None
            for page in world.s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                found.update(f"s3://{bucket}/{item['Key']}" for item in page.get("Contents", []))
        else:
            assert world.gcs is not None
            found.update(
                f"gs://{bucket}/{blob.name}" for blob in world.gcs.list_blobs(bucket, prefix=prefix)
            )
    return found


def unfinished_uploads(world: World, project: str) -> list[str]:
    """Multipart uploads started and never completed or aborted, under the project."""
    left: list[str] = []
    for scheme, bucket, path in _roots(world):
        if scheme != "s3":
            continue
        assert world.s3 is not None
        prefix = f"{path}/{project}/" if path else f"{project}/"
        listed = world.s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        left.extend(f"s3://{bucket}/{u['Key']}" for u in listed.get("Uploads", []))
    return left


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_problem(found: bytes | Archived | None, expected: bytes) -> str | None:
    if found is None:
        return "missing"
    if isinstance(found, Archived):
        if found.size != len(expected) or found.etag != hashlib.md5(expected).hexdigest():
            return f"archived object differs ({found.size} bytes, etag {found.etag})"
        return None
    if sha256(found) != sha256(expected):
        return f"sha256 {sha256(found)[:12]}, expected {sha256(expected)[:12]}"
    return None


# --- the catalog ------------------------------------------------------------------------------


def wipe(engine: Engine) -> None:
    """Empty every table (a fresh catalog for the next injection)."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))


@dataclass
class Seeded:
    """What one injection starts from."""

    scenario: Scenario
    project: str
    checkpoint_id: str
    action_id: str
    prefix: str  # <project>/<run>/step-<n>, as the service places checkpoints
    manifest: list[dict[str, Any]]
    good: dict[str, bytes]  # the manifest's bytes
    placed: dict[str, bytes]  # what the source (and replica) hold: `good` unless damaged
    locations: list[tuple[str, str, str]]  # (tier, role, uri) as seeded

    def expected_at(self, uri: str) -> dict[str, bytes]:
        """What a catalogued location must hold: a seeded one what was placed there, a
        new one the manifest's bytes."""
        return self.placed if uri in {loc[2] for loc in self.locations} else self.good


def shards(project: str, n: int, size: int = 2048) -> dict[str, bytes]:
    """`n` small files whose bytes differ between injections (a stale copy shows)."""
    return {
        f"model/shard-{i}.bin": (f"{project} shard {i};".encode() * size)[:size] for i in range(n)
    }


def manifest_of(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {
            "path": path,
            "size_bytes": len(data),
            "sha256": sha256(data),
            "crc32c": google_crc32c.value(data).to_bytes(4, "big").hex(),
        }
        for path, data in sorted(files.items())
    ]


def blocker_uri(world: World, scenario: Scenario, prefix: str) -> str:
    """A file named like the directory the copy's files go into."""
    assert scenario.target is not None
    return f"{world.tiers[scenario.target].parsed.join(prefix)}/model"


def seed(world: World, factory: sessionmaker[Session], scenario: Scenario) -> Seeded:
    """A run with one checkpoint on `scenario.source` (and its replica) and one pending
    action, through the service functions the API uses."""
    project = f"p{uuid.uuid4().hex[:12]}"
    prefix = f"{project}/run-1/step-{STEP}"
    now = datetime.now(UTC)
    good = shards(project, scenario.files)
    placed = dict(good)
    if scenario.damage == "corrupt":
        first = next(iter(placed))
        placed[first] = bytes(b ^ 0xFF for b in placed[first])
    source = world.tiers[scenario.source]
    source_uri = source.parsed.join(prefix)
    for path, data in placed.items():
        put_object(world, source, _object_uri(source_uri, path), data)
    manifest = manifest_of(good)
    with session_scope(factory) as session:
        view, _ = create_run(
            session,
            project=project,
            name="run-1",
            labels={},
            policy=None,
            resumed_from=None,
            actor=ACTOR,
            now=now,
        )
        checkpoint, created = register_checkpoint(
            session,
            tiers=list(world.tiers.values()),
            storages=STORAGES,
            run_id=view.run.id,
            reg=Registration(
                step=STEP,
                klass="milestone",
                uri=source_uri,
                files=manifest,
                size_bytes=None,
                metrics={},
                labels={},
                created_at=now - timedelta(hours=1),
                committed=True,
            ),
            actor=ACTOR,
            now=now,
        )
        assert created
        checkpoint_id, run_id, size = checkpoint.id, view.run.id, checkpoint.size_bytes
    locations = [(source.name, "primary", source_uri)]
    if scenario.replica is not None:
        replica = world.tiers[scenario.replica]
        replica_uri = replica.parsed.join(prefix)
        for path, data in placed.items():
            put_object(world, replica, _object_uri(replica_uri, path), data)
        locations.append((replica.name, "replica", replica_uri))
    if scenario.damage == "blocked":
        assert scenario.target is not None
        put_object(
            world, world.tiers[scenario.target], blocker_uri(world, scenario, prefix), b"in the way"
        )
    if scenario.damage == "missing":
        gone = next(iter(placed))
        delete_object(world, _object_uri(source_uri, gone))
        del placed[gone]
    with session_scope(factory) as session:
        if scenario.replica is not None:
            session.add(
                Location(
                    checkpoint_id=checkpoint_id,
                    tier=locations[1][0],
                    uri=locations[1][2],
                    storage_class=world.tiers[locations[1][0]].storage_class,
                    role="replica",
                )
            )
        if scenario.kind == "purge":  # trashed a week ago: the purge is due
            row = session.get(Checkpoint, checkpoint_id)
            assert row is not None
            row.state, row.trashed_at = "trashed", now - timedelta(days=8)
            add_active(session, run_id, checkpoints=-1, size=-size)
            action = purge_action(session, checkpoint_id, run_id, size, now)
        else:
            action = new_action(
                checkpoint_id=checkpoint_id,
                run_id=run_id,
                kind=scenario.kind,
                from_tier=scenario.source,
                to_tier=scenario.target,
                rule="manual",
                reason="crash test",
                state="pending",
                size=size,
                actor=ACTOR,
                now=now,
            )
        session.add(action)
        action_id = action.id
    return Seeded(
        scenario, project, checkpoint_id, action_id, prefix, manifest, good, placed, locations
    )


@dataclass(frozen=True)
class Catalog:
    state: str
    locations: list[tuple[str, str, str]]
    actions: list[tuple[str, str, str, str | None, int, str | None]]  # id kind state step...
    tier: str | None = None  # the checkpoint row's own record of its primary's tier

    def tier_problems(self) -> list[str]:
        """The row's tier is its primary location's (None without one), at every moment a
        transaction left it: a plan reads the row's, a worker acts on the locations."""
        primary = next((t for t, role, _ in self.locations if role == "primary"), None)
        if self.tier == primary:
            return []
        return [f"the checkpoint's row says tier {self.tier!r}, its primary is on {primary!r}"]

    def action(self, action_id: str) -> tuple[str, str, str, str | None, int, str | None]:
        return next(a for a in self.actions if a[0] == action_id)


def read_catalog(factory: sessionmaker[Session], checkpoint_id: str) -> Catalog:
    with session_scope(factory) as session:
        checkpoint = session.get(Checkpoint, checkpoint_id)
        assert checkpoint is not None
        locations = session.execute(
            select(Location.tier, Location.role, Location.uri).where(
                Location.checkpoint_id == checkpoint_id
            )
        ).all()
        actions = session.execute(
            select(
                Action.id, Action.kind, Action.state, Action.step, Action.attempts, Action.error
            ).where(Action.checkpoint_id == checkpoint_id)
        ).all()
        return Catalog(
            checkpoint.state,
            sorted((t, r, u) for t, r, u in locations),
            sorted((i, k, s, st, a, e) for i, k, s, st, a, e in actions),
            checkpoint.tier,
        )


# --- invariants -------------------------------------------------------------------------------


def location_problems(world: World, seeded: Seeded, uri: str) -> list[str]:
    problems = []
    for path, data in sorted(seeded.expected_at(uri).items()):
        problem = content_problem(read_object(world, _object_uri(uri, path)), data)
        if problem is not None:
            problems.append(f"{_object_uri(uri, path)}: {problem}")
    return problems


def after_crash(world: World, seeded: Seeded, catalog: Catalog) -> list[str]:
    """Invariant 3 at the moment of death: readable, bytes intact, from a catalogued place.
    A purge is the one action allowed to take bytes away: it may stop half-way."""
    if seeded.scenario.kind == "purge":
        if catalog.state not in ("trashed", "deleted"):
            return [f"state {catalog.state}"]
        return catalog.tier_problems()
    if catalog.state in ("deleted",) or not catalog.locations:
        return [f"checkpoint {catalog.state} with locations {catalog.locations}"]
    by_location = {uri: location_problems(world, seeded, uri) for _, _, uri in catalog.locations}
    violations = [f"catalogued {uri} unreadable: {p}" for uri, p in by_location.items() if p]
    if all(by_location.values()):
        violations.insert(0, "no catalogued location is readable")
    return violations + catalog.tier_problems()


def expected_end(world: World, seeded: Seeded) -> tuple[str, list[tuple[str, str, str]]]:
    """The checkpoint's state and locations once the action is over."""
    scenario = seeded.scenario
    if scenario.outcome == "failed":
        return "active", sorted(seeded.locations)
    if scenario.kind == "delete":
        return "trashed", sorted(seeded.locations)
    if scenario.kind == "purge":
        return "deleted", []
    assert scenario.target is not None
    source, target = world.tiers[scenario.source], world.tiers[scenario.target]
    in_place = source.url == target.url
    dest_uri = source.parsed.join(seeded.prefix) if in_place else target.parsed.join(seeded.prefix)
    if scenario.kind == "move":
        return "active", [(target.name, "primary", dest_uri)]
    return "active", sorted([*seeded.locations, (target.name, "replica", dest_uri)])


def at_end(world: World, seeded: Seeded, catalog: Catalog) -> list[str]:
    """The action is over, as promised, and nothing is left behind."""
    violations: list[str] = []
    open_actions = [a for a in catalog.actions if a[2] not in TERMINAL]
    if open_actions:
        return [f"actions still open after {MAX_PASSES} workers: {open_actions}"]
    _, kind, state, step, _attempts, error = catalog.action(seeded.action_id)
    if state != seeded.scenario.outcome:
        violations.append(f"{kind} ended {state} (step {step}, error {error!r})")
    if state == "done" and error is not None:
        violations.append(f"done with an error: {error}")
    if len(catalog.actions) != 1:
        violations.append(f"ledger holds {catalog.actions}")
    want_state, want_locations = expected_end(world, seeded)
    if catalog.state != want_state:
        violations.append(f"checkpoint {catalog.state}, expected {want_state}")
    if catalog.locations != want_locations:
        violations.append(f"locations {catalog.locations}, expected {want_locations}")
    violations.extend(catalog.tier_problems())
    for _, _, uri in catalog.locations:
        violations.extend(f"catalogued {p}" for p in location_problems(world, seeded, uri))
    expected = {
        _object_uri(uri, path)
        for _, _, uri in catalog.locations
        for path in seeded.expected_at(uri)
    }
    if seeded.scenario.damage == "blocked":  # not the service's to remove: it wrote none of it
        expected.add(blocker_uri(world, seeded.scenario, seeded.prefix))
    found = objects_under(world, seeded.project)
    if found - expected:
        violations.append(f"left behind: {sorted(found - expected)}")
    if expected - found:
        violations.append(f"missing: {sorted(expected - found)}")
    uploads = unfinished_uploads(world, seeded.project)
    if uploads:
        violations.append(f"unfinished multipart uploads: {uploads}")
    return violations


# --- running workers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One injection: the `point` (`name#n`) reached in worker process number `worker`,
    right after `after` (None: the first point that process reached)."""

    worker: int
    point: str
    after: str | None

    def __str__(self) -> str:
        return f"worker {self.worker} at {self.point}"

    @property
    def name(self) -> str:
        return self.point.split("#")[0]


@dataclass
class Matrix:
    """One scenario's tiers and catalog: how to run a worker process and read the results."""

    world: World
    engine: Engine
    database_url: str
    trace_dir: Path
    _factory: sessionmaker[Session] | None = None

    @property
    def factory(self) -> sessionmaker[Session]:
        if self._factory is None:
            self._factory = make_session_factory(self.engine)
        return self._factory

    def job(
        self, worker: int, *, crash_at: str | None = None, trace: Path | None = None
    ) -> WorkerJob:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        return WorkerJob(
            database_url=self.database_url,
            data_dir=str(self.world.data_dir),
            tiers_file=str(self.world.tiers_file),
            clock_offset=LEASE_PASSED * worker,
            env=self.world.child_env(),
            crash_at=crash_at,
            trace=str(trace) if trace is not None else None,
            log=str(self.trace_dir / "workers.log"),
        )

    def finished(self, seeded: Seeded) -> bool:
        return all(
            a[2] in TERMINAL for a in read_catalog(self.factory, seeded.checkpoint_id).actions
        )

    def trace_file(self) -> Path:
        return self.trace_dir / f"{uuid.uuid4().hex}.trace"

    def run_until_finished(self, seeded: Seeded, first: int) -> int:
        """Fresh workers from number `first` on until the action is over; the next number."""
        worker = first
        while worker < first + MAX_PASSES and not self.finished(seeded):
            code = run_worker(self.job(worker))
            assert code == 0, f"worker {worker} exited with {code}"
            worker += 1
        return worker


def read_trace(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def reference_trace(matrix: Matrix, scenario: Scenario) -> tuple[list[Target], list[str]]:
    """Run the action to its end without a crash, tracing; the injection targets (one per
    point reached, a repeated transition of a worker loop once) and the end's violations."""
    wipe(matrix.engine)
    seeded = seed(matrix.world, matrix.factory, scenario)
    targets: list[Target] = []
    seen: set[tuple[str | None, str]] = set()
    worker = 0
    while worker < MAX_PASSES and not matrix.finished(seeded):
        trace = matrix.trace_file()
        code = run_worker(matrix.job(worker, trace=trace))
        assert code == 0, f"{scenario.id}: worker {worker} exited with {code}"
        after: str | None = None
        for point in read_trace(trace):
            if (after, point) not in seen:
                seen.add((after, point))
                targets.append(Target(worker, point, after))
            after = point
        worker += 1
    catalog = read_catalog(matrix.factory, seeded.checkpoint_id)
    return targets, at_end(matrix.world, seeded, catalog)


def inject(matrix: Matrix, scenario: Scenario, target: Target) -> list[str]:
    """Kill a worker at `target`, check the moment of death, recover, check the end."""
    wipe(matrix.engine)
    seeded = seed(matrix.world, matrix.factory, scenario)
    for worker in range(target.worker):
        assert run_worker(matrix.job(worker)) == 0
    trace = matrix.trace_file()
    code = run_worker(matrix.job(target.worker, crash_at=target.point, trace=trace))
    reached = read_trace(trace)
    if code != KILLED or not reached or reached[-1] != target.point:
        return [f"expected SIGKILL at {target.point}: exit {code}, trace {reached}"]
    violations = after_crash(
        matrix.world, seeded, read_catalog(matrix.factory, seeded.checkpoint_id)
    )
    matrix.run_until_finished(seeded, target.worker + 1)
    violations += at_end(matrix.world, seeded, read_catalog(matrix.factory, seeded.checkpoint_id))
    return violations


@dataclass
class ScenarioReport:
    scenario: str
    database: str
    points: list[str]  # distinct crash point names reached
    injections: list[str]  # every target killed at
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"{self.database} {self.scenario}: {len(self.injections)} injections over "
            f"{len(self.points)} crash points, {len(self.violations)} violations, "
            f"{self.seconds:.1f} s"
        )


def run_matrix(matrix: Matrix, scenario: Scenario, database: str) -> ScenarioReport:
    """Every injection target of `scenario`; the report names each violation found."""
    started = time.monotonic()
    targets, baseline = reference_trace(matrix, scenario)
    report = ScenarioReport(
        scenario.id,
        database,
        points=sorted({t.name for t in targets}),
        injections=[str(t) for t in targets],
        violations=[f"without a crash: {v}" for v in baseline],
    )
    for target in targets:
        report.violations += [f"crash {target}: {v}" for v in inject(matrix, scenario, target)]
    report.seconds = time.monotonic() - started
    return report


def write_report(directory: Path, report: ScenarioReport) -> Path:
    """The report as JSON in `directory` (one file per scenario and database)."""
    directory.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in f"{report.database}-{report.scenario}")
    path = directory / f"{slug}.json"
    path.write_text(json.dumps(asdict(report), indent=2))
    return path


def coverage(directory: Path) -> dict[str, Any]:
    """Every report written to `directory`, totalled: what docs cite as the crash coverage
    (injections and crash points per scenario and database)."""
    reports = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    reports = [r for r in reports if "scenario" in r]
    return {
        "scenarios": [
            {
                "scenario": r["scenario"],
                "database": r["database"],
                "injections": len(r["injections"]),
                "crash_points": len(r["points"]),
                "violations": len(r["violations"]),
            }
            for r in reports
        ],
        "injections": sum(len(r["injections"]) for r in reports),
        "crash_points_reached": sorted({p for r in reports for p in r["points"]}),
    }


def check_scenario(
    matrix: Matrix,
    scenario: Scenario,
    report_dir: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Run the scenario's whole matrix, write its report, fail on any violation; the summary
    goes to the figures printed at the end of the test run."""
    report = run_matrix(matrix, scenario, matrix.engine.dialect.name)
    write_report(report_dir, report)
    assert report.injections, "the action reached no crash point"
    assert not report.violations, "\n".join(report.violations)
    record_property(FIGURES, f"crash injection: {report.summary()}")
