"""Providers misbehave: with one request in five to S3 and to GCS failing (503 SlowDown,
500, 429, timeouts, reset connections, truncated answers), moves and copies local -> S3,
S3 -> GCS and GCS -> local, and purges on every provider, still all end `done`; the
retries show in the metrics and against the action that needed them; and at no moment
does a checkpoint lack a catalogued copy whose bytes match its manifest.

The S3 and GCS servers sit behind FaultyProxy in random mode. The guard below reads
every catalogued location straight from the servers (past the proxies) after each
action and whenever the service removes anything, and sorts each removal into a purge,
the source of a move whose copy is catalogued, or a bad copy nobody catalogued.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pytest
from botocore.config import Config
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.cloud import storage as gcs_lib
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select
from sqlalchemy.orm import selectinload

from app.api import auth
from app.db.models import Action, Checkpoint
from app.db.session import session_scope
from app.domain.tier import Tier, locate
from app.main import NO_BACKGROUND, create_app
from app.services.lifecycle.worker import Worker
from app.settings import Settings
from app.storage import retry
from app.storage.base import join_key
from app.storage.gcs import GcsStorage
from app.storage.local import LocalStorage
from app.storage.registry import StorageRegistry
from app.storage.s3 import S3Storage
from app.storage.s3.client import new_client as new_s3_client
from tests.builders import (
    end_run,
    file_entries,
    iso,
    ledger,
    make_executor,
    make_run,
    put_policy,
    register,
    tree,
    with_tiers,
    write_checkpoint,
)
from tests.figures import FIGURES
from tests.storage.faulty_proxy import FaultyProxy
from tests.storage.gcs_server import GcsEndpoint, anonymous_client
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint, s3_client
from tests.storage.s3_servers import new_bucket as new_s3_bucket

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

RATE = 0.2
SEED = 5
READ_TIMEOUT = 0.5  # the clients' here; a "timeout" fault holds a request for STALL
STALL = 1.0
DRAIN_DEADLINE_S = 180.0

POLICY = """\
name: faults
rules:
  - {name: hot-to-s3, class: mover, when: {on_tier: [hot]}, action: {move_to: s3}}
  - {name: s3-to-gcs, class: mover, when: {on_tier: [s3]}, action: {move_to: gcs}}
  - {name: gcs-to-vault, class: mover, when: {on_tier: [gcs]}, action: {move_to: vault}}
  - {name: copy-to-s3, class: copier, when: {on_tier: [hot]}, action: {copy_to: s3}}
  - {name: copy-to-gcs, class: copier, when: {on_tier: [s3]}, action: {copy_to: gcs}}
  - {name: copy-to-vault, class: copier, when: {on_tier: [gcs]}, action: {copy_to: vault}}
"""


# -- servers behind faulty proxies --------------------------------------------------------------


@pytest.fixture
def s3_proxy(moto_s3: S3Endpoint) -> Iterator[FaultyProxy]:
    with FaultyProxy(moto_s3.url, stall=STALL) as proxy:
        yield proxy


@pytest.fixture
def gcs_proxy(fake_gcs: GcsEndpoint) -> Iterator[FaultyProxy]:
    with FaultyProxy(fake_gcs.url, dialect="gcs", stall=STALL) as proxy:
        yield proxy


@pytest.fixture
def quick_clients(
    monkeypatch: pytest.MonkeyPatch, s3_proxy: FaultyProxy, gcs_proxy: FaultyProxy
) -> Iterator[StorageRegistry]:
    """The adapters' clients give up reading after READ_TIMEOUT (theirs are minutes long),
    so a request the proxy holds is a real client-side timeout; backoff is instant. The
    service's storage registry is one built with these clients, GCS's aimed at the proxy."""
    quick = Config(connect_timeout=READ_TIMEOUT, read_timeout=READ_TIMEOUT)
    client = anonymous_client(gcs_proxy.url)
    request = client._http.request

    def timed_request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = (READ_TIMEOUT, READ_TIMEOUT)
        return request(method, url, *args, **kwargs)

    monkeypatch.setattr(client._http, "request", timed_request)
    clients = StorageRegistry(
        s3_client=lambda endpoint, config: new_s3_client(endpoint, config.merge(quick)),
        gcs_client=lambda: client,
    )
    monkeypatch.setattr(retry, "backoff", lambda attempt, **_: 0.001)
    yield clients
    clients.close()


@pytest.fixture
def app(settings: Settings, clean_engine: Engine, quick_clients: StorageRegistry) -> FastAPI:
    """The service, its storage registry the one with the quick clients."""
    return create_app(settings, engine=clean_engine, roles=NO_BACKGROUND, storages=quick_clients)


@pytest.fixture(autouse=True)
def metrics_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The access rule of /metrics (`read`), until the rule table has it."""
    if ("GET", "/metrics") not in auth.RULES:
        rules = {**auth.RULES, ("GET", "/metrics"): auth.READ}
        monkeypatch.setattr(auth, "RULES", MappingProxyType(rules))


@dataclass
class Buckets:
    s3: str
    gcs: str


@pytest.fixture
def buckets(moto_s3: S3Endpoint, fake_gcs: GcsEndpoint) -> Buckets:
    return Buckets(new_s3_bucket(moto_s3, "faults"), new_gcs_bucket(fake_gcs, "faults"))


@pytest.fixture
def settings(
    settings: Settings,
    data_dir: Path,
    buckets: Buckets,
    s3_proxy: FaultyProxy,
    quick_clients: StorageRegistry,
) -> Settings:
    tiers = [
        {"name": "hot", "url": f"file://{data_dir / 'hot'}"},
        {"name": "s3", "url": f"s3://{buckets.s3}/ckpt", "endpoint_url": s3_proxy.url},
        {"name": "gcs", "url": f"gs://{buckets.gcs}/ckpt"},
        {"name": "vault", "url": f"file://{data_dir / 'vault'}"},
    ]
    return with_tiers(settings, tiers)


# -- reading the servers directly -----------------------------------------------------------


class Direct:
    """A location's files read straight from the servers, never through the proxies."""

    def __init__(self, tiers: list[Tier], s3_endpoint: S3Endpoint, gcs_endpoint: GcsEndpoint):
        self.tiers = tiers
        self.s3: S3Client = s3_client(s3_endpoint)
        self.gcs: gcs_lib.Client = anonymous_client(gcs_endpoint.url)

    def files(self, uri: str) -> dict[str, bytes]:
        """Every object under `uri`, by its path relative to it ({} when there is none)."""
        located = locate(uri, self.tiers)
        parsed = located.tier.parsed
        if parsed.scheme == "file":
            return tree(Path(parsed.path) / located.key)
        prefix = join_key(parsed.path, located.key) + "/"
        found: dict[str, bytes] = {}
        if parsed.scheme == "s3":
            pages = self.s3.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=parsed.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    body = self.s3.get_object(Bucket=parsed.bucket, Key=item["Key"])["Body"]
                    found[item["Key"].removeprefix(prefix)] = body.read()
            return found
        for blob in self.gcs.list_blobs(parsed.bucket, prefix=prefix):
            found[blob.name.removeprefix(prefix)] = blob.download_as_bytes()
        return found

    def put(self, uri: str, files: dict[str, bytes]) -> None:
        located = locate(uri, self.tiers)
        parsed = located.tier.parsed
        for path, data in files.items():
            key = join_key(join_key(parsed.path, located.key), path)
            if parsed.scheme == "s3":
                self.s3.put_object(Bucket=parsed.bucket, Key=key, Body=data)
            else:
                self.gcs.bucket(parsed.bucket).blob(key).upload_from_string(data)


def matches(files: dict[str, bytes], manifest: list[dict[str, Any]]) -> bool:
    """The files are exactly the manifest's, each with its size and sha256."""
    return {
        path: (len(data), hashlib.sha256(data).hexdigest()) for path, data in files.items()
    } == {entry["path"]: (entry["size_bytes"], entry["sha256"]) for entry in manifest}


# -- the guard -------------------------------------------------------------------------------


@dataclass
class Removal:
    uri: str
    why: str  # "purge", "move source" or "uncatalogued copy"
    action_id: str | None


@dataclass
class Guard:
    app: FastAPI
    direct: Direct
    violations: list[str] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    checks: int = 0

    def _catalog(self) -> list[tuple[str, str, list[dict[str, Any]], list[str]]]:
        with session_scope(self.app.state.session_factory) as session:
            rows = session.execute(
                select(Checkpoint).options(selectinload(Checkpoint.locations))
            ).scalars()
            return [
                (c.id, c.state, list(c.files or []), [x.uri for x in c.locations]) for c in rows
            ]

    def after_action(self, action_id: str) -> None:
        """Every catalogued location of a live or trashed checkpoint holds its bytes."""
        self.checks += 1
        for checkpoint_id, state, manifest, uris in self._catalog():
            if state not in ("active", "trashed"):
                continue
            if not uris:
                self.violations.append(f"after {action_id}: {checkpoint_id} has no location")
            for uri in uris:
                if not matches(self.direct.files(uri), manifest):
                    self.violations.append(f"after {action_id}: {uri} does not match")

    def removing(self, uri: str) -> None:
        """Before the service removes `uri`: every active checkpoint keeps a catalogued copy
        elsewhere that matches, and the removal is one the lifecycle allows."""
        self.checks += 1
        catalog = self._catalog()
        for checkpoint_id, state, manifest, uris in catalog:
            if state != "active":
                continue
            kept = [u for u in uris if u != uri and matches(self.direct.files(u), manifest)]
            if not kept:
                self.violations.append(f"removing {uri} leaves {checkpoint_id} no good copy")
        trashed = {u for _id, state, _m, uris in catalog if state == "trashed" for u in uris}
        catalogued = {u for _id, _state, _m, uris in catalog for u in uris}
        with session_scope(self.app.state.session_factory) as session:
            running = session.execute(
                select(
                    Action.id, Action.kind, Action.step, Action.source_uri, Action.dest_uri
                ).where(Action.state == "running")
            ).all()
        move = next(
            (a.id for a in running if a.kind == "move" and a.source_uri == uri),
            None,
        )
        if uri in trashed:
            self.removals.append(Removal(uri, "purge", None))
        elif move is not None and uri not in catalogued:
            step = next(a.step for a in running if a.id == move)
            if step != "switched":
                self.violations.append(f"{move} removes its source {uri} at step {step}")
            self.removals.append(Removal(uri, "move source", move))
        elif uri not in catalogued and any(a.dest_uri == uri for a in running):
            self.removals.append(Removal(uri, "uncatalogued copy", None))
        else:
            self.violations.append(f"{uri} removed: neither trashed, a moved source nor a copy")


@pytest.fixture
def guard(
    app: FastAPI,
    monkeypatch: pytest.MonkeyPatch,
    moto_s3: S3Endpoint,
    fake_gcs: GcsEndpoint,
) -> Guard:
    tiers: list[Tier] = app.state.tiers
    watch = Guard(app, Direct(tiers, moto_s3, fake_gcs))

    def uri_of(adapter: object, prefix: str) -> str:
        tier = next(t for t in tiers if app.state.storages.storage_for(t) is adapter)
        return tier.parsed.join(prefix)

    for adapter_class in (LocalStorage, S3Storage, GcsStorage):
        original: Callable[[Any, str], int] = adapter_class.delete_prefix

        def guarded(
            adapter: Any, prefix: str, original: Callable[[Any, str], int] = original
        ) -> int:
            watch.removing(uri_of(adapter, prefix))
            return original(adapter, prefix)

        monkeypatch.setattr(adapter_class, "delete_prefix", guarded)
    execute = Worker.execute

    def checked(executor: Worker, action_id: str) -> None:
        execute(executor, action_id)
        watch.after_action(action_id)

    monkeypatch.setattr(Worker, "execute", checked)
    return watch


# -- driving the service ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.moment = datetime.now(UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self) -> None:
        self.moment += timedelta(minutes=10)  # past any retry's backoff (at most 5 min)


def drain(app: FastAPI, client: TestClient, clock: Clock) -> int:
    """Run workers until no action is open; returns how many executions that took."""
    executions = 0
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    while True:
        executions += make_executor(app, trash_retention=timedelta(0), clock=clock.now).drain()
        open_actions = [a for a in ledger(client) if a["state"] in ("pending", "running")]
        if not open_actions:
            return executions
        assert time.monotonic() < deadline, open_actions
        clock.advance()


def shards(rng: random.Random, n: int = 3) -> dict[str, bytes]:
    return {f"model/shard-{i}.bin": rng.randbytes(rng.randint(1_000, 40_000)) for i in range(n)}


def scrape(client: TestClient) -> Counter[tuple[str, str]]:
    """(metric sample, provider or kind) -> value, summed over the other labels."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "ckpt_storage_retries_total":
                out[(sample.name, sample.labels["provider"])] += int(sample.value)
            elif sample.name == "ckpt_action_storage_retries_total":
                out[(sample.name, sample.labels["kind"])] += int(sample.value)
    return out


def test_moves_copies_and_purges_survive_a_fifth_of_requests_failing(
    client: TestClient,
    app: FastAPI,
    data_dir: Path,
    buckets: Buckets,
    s3_proxy: FaultyProxy,
    gcs_proxy: FaultyProxy,
    guard: Guard,
    caplog: pytest.LogCaptureFixture,
    database_url: str,
    record_property: Callable[[str, object], None],
) -> None:
    rng = random.Random(SEED)
    tiers: list[Tier] = app.state.tiers
    url = {t.name: t.parsed for t in tiers}
    run = make_run(client, name="faults")
    contents: dict[str, dict[str, bytes]] = {}

    def place(tier: str, step: int, klass: str) -> str:
        files = shards(rng)
        where = f"imported/step-{step}"
        if url[tier].scheme == "file":
            uri = write_checkpoint(Path(url[tier].path) / "imported", f"step-{step}", files)
        else:
            uri = url[tier].join(where)
            guard.direct.put(uri, files)
        created = iso(datetime.now(UTC) - timedelta(hours=1))
        response = register(
            client, run["id"], step, uri, klass, files=file_entries(files), created_at=created
        )
        assert response.status_code == 201, response.text
        checkpoint_id: str = response.json()["id"]
        contents[checkpoint_id] = files
        return checkpoint_id

    movers = [place("hot", step, "mover") for step in (1, 2)]
    local_copy, s3_copy, gcs_copy = (
        place(tier, step, "copier") for tier, step in (("hot", 10), ("s3", 20), ("gcs", 30))
    )
    end_run(client, run["id"], datetime.now(UTC) - timedelta(hours=1))
    put_policy(client, POLICY)
    before = scrape(client)
    caplog.set_level(logging.INFO, logger="app")
    s3_proxy.randomly(RATE, seed=SEED)
    gcs_proxy.randomly(RATE, seed=SEED + 1)
    clock = Clock()
    started = time.monotonic()

    executions = 0
    for _ in range(6):
        created = client.post("/v1/sweeps").json()["actions"]
        if not created:
            break
        executions += drain(app, client, clock)
    else:
        pytest.fail("the policy never settled")
    for doomed in (local_copy, s3_copy):  # purged from hot + S3, and from S3 + GCS
        assert client.delete(f"/v1/checkpoints/{doomed}").status_code == 202
    executions += drain(app, client, clock)
    s3_proxy.calm()
    gcs_proxy.calm()
    elapsed = time.monotonic() - started

    # every action ended done, and they are the ones the policy and the deletes asked for
    actions = ledger(client)
    assert {a["state"] for a in actions} == {"done"}, [
        (a["kind"], a["from_tier"], a["to_tier"], a["state"], a["error"]) for a in actions
    ]
    assert sorted((a["kind"], a["from_tier"] or "", a["to_tier"] or "") for a in actions) == sorted(
        [("move", "hot", "s3"), ("move", "s3", "gcs"), ("move", "gcs", "vault")] * 2
        + [("copy", "hot", "s3"), ("copy", "s3", "gcs"), ("copy", "gcs", "vault")]
        + [("delete", "hot", ""), ("delete", "s3", ""), ("purge", "", ""), ("purge", "", "")]
    )

    # the catalog ends where it should, every location byte for byte, every source gone
    def locations(checkpoint_id: str) -> list[tuple[str, str]]:
        body = client.get(f"/v1/checkpoints/{checkpoint_id}").json()
        return sorted((loc["tier"], loc["role"]) for loc in body["locations"])

    for mover in movers:
        assert locations(mover) == [("vault", "primary")]
    assert locations(gcs_copy) == [("gcs", "primary"), ("vault", "replica")]
    for doomed in (local_copy, s3_copy):
        assert client.get(f"/v1/checkpoints/{doomed}").json()["state"] == "deleted"
        assert locations(doomed) == []
    for checkpoint_id in (*movers, gcs_copy):
        for uri in [
            loc["uri"] for loc in client.get(f"/v1/checkpoints/{checkpoint_id}").json()["locations"]
        ]:
            assert guard.direct.files(uri) == contents[checkpoint_id], uri
    with session_scope(app.state.session_factory) as session:
        moved = dict(
            session.execute(select(Action.id, Action.source_uri).where(Action.kind == "move")).all()
        )
    for action_id, source_uri in moved.items():
        assert source_uri is not None and guard.direct.files(source_uri) == {}, action_id

    # nothing was removed that the lifecycle did not allow, and only after the copy
    assert guard.violations == []
    assert guard.checks >= executions
    by_why = Counter(r.why for r in guard.removals)
    assert by_why["move source"] >= len(moved)
    assert {r.action_id for r in guard.removals if r.why == "move source"} == set(moved)
    assert by_why["purge"] >= 4  # hot + s3, s3 + gcs

    # the faults happened, and every retry is counted: per provider, per action, in the logs
    injected = s3_proxy.injected() + gcs_proxy.injected()
    requests = s3_proxy.requests + gcs_proxy.requests
    assert s3_proxy.injected().total() >= 5 and gcs_proxy.injected().total() >= 5
    assert 0.1 <= injected.total() / requests <= 0.3, (injected, requests)
    after = scrape(client)
    grew = after - before
    assert grew[("ckpt_storage_retries_total", "s3")] > 0, grew
    assert grew[("ckpt_storage_retries_total", "gcs")] > 0, grew
    retried = [r for r in caplog.records if r.getMessage() == "transient storage error, retrying"]
    tallies = [
        r.__dict__["retries"]
        for r in caplog.records
        if r.getMessage() in ("action finished", "action attempt ended")
    ]
    assert len(tallies) == executions
    assert sum(tallies) == len(retried) > 0  # every retry, on whatever thread, was tallied
    per_action = sum(
        v for (name, _), v in grew.items() if name == "ckpt_action_storage_retries_total"
    )
    assert per_action == len(retried)
    assert sum(a["retries"] for a in ledger(client)) == len(retried)  # and in the ledger
    record_property(
        FIGURES,
        f"provider faults ({database_url.split(':')[0]}): {requests} requests, "
        f"{injected.total()} faults injected {dict(injected)}, {len(retried)} retries, "
        f"{executions} executions of {len(actions)} actions, all done, {elapsed:.1f} s",
    )
