"""StorageRegistry: one adapter per tier location, built lazily from injected clients.

No server is needed: building an adapter or a client opens no connection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.config import Config
from google.cloud import storage

from app.domain.tier import Tier
from app.storage.gcs import GcsStorage
from app.storage.gcs import client as gcs_client
from app.storage.local import LocalStorage
from app.storage.registry import StorageRegistry
from app.storage.s3 import S3Storage
from app.storage.s3.client import new_client
from tests.storage.gcs_server import anonymous_client
from tests.storage.s3_servers import dummy_credentials

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

NOWHERE = "http://127.0.0.1:9"  # never contacted


class S3Clients:
    """An S3 client factory that records what it was asked for; the clients are real."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[str | None, Config]] = []
        self.closed = 0
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, endpoint_url: str | None, config: Config) -> S3Client:
        with self._lock:
            self.calls.append((endpoint_url, config))
        time.sleep(self.delay)
        client = new_client(endpoint_url, config)
        close = client.close

        def counted_close() -> None:
            with self._lock:
                self.closed += 1
            close()

        client.close = counted_close  # type: ignore[method-assign]
        return client


def s3_tier(
    name: str = "s3", *, bucket: str = "bucket", request_checksums: str = "when_supported"
) -> Tier:
    return Tier(
        name=name,
        url=f"s3://{bucket}/ckpt",
        rank=1,
        endpoint_url=NOWHERE,
        request_checksums=request_checksums,
    )


@pytest.fixture(autouse=True)
def credentials() -> None:
    dummy_credentials()


def test_one_adapter_per_location(tmp_path: Path) -> None:
    clients = StorageRegistry()
    hot = Tier(name="hot", url=f"file://{tmp_path}/hot", rank=0)
    same_place = Tier(name="also-hot", url=f"file://{tmp_path}/hot", rank=1)
    vault = Tier(name="vault", url=f"file://{tmp_path}/vault", rank=2)

    adapter = clients.storage_for(hot)

    assert isinstance(adapter, LocalStorage)
    assert adapter.root == tmp_path / "hot"
    assert clients.storage_for(hot) is adapter
    assert clients.storage_for(same_place) is adapter  # tiers on one location share it
    assert clients.storage_for(vault) is not adapter
    assert StorageRegistry().storage_for(hot) is not adapter  # each registry its own


def test_s3_adapters_get_the_injected_client_built_for_the_tier() -> None:
    make = S3Clients()
    clients = StorageRegistry(s3_client=make)
    tier = s3_tier(request_checksums="when_required")

    adapter = clients.storage_for(tier)

    assert isinstance(adapter, S3Storage)
    [(endpoint, built)] = make.calls
    config: Any = built  # botocore sets a Config's options as attributes at run time
    assert endpoint == NOWHERE
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}
    assert config.s3 == {"addressing_style": "path"}
    assert adapter.client.meta.endpoint_url == NOWHERE
    assert (adapter.bucket, adapter.prefix, adapter.request_checksums) == (
        "bucket",
        "ckpt",
        "when_required",
    )
    assert clients.storage_for(tier) is adapter
    assert clients.storage_for(s3_tier(request_checksums="when_supported")) is not adapter
    assert len(make.calls) == 2  # one client per adapter


def test_gcs_adapters_get_the_injected_client() -> None:
    client = anonymous_client(NOWHERE)
    asked: list[storage.Client] = []

    def make() -> storage.Client:
        asked.append(client)
        return client

    clients = StorageRegistry(gcs_client=make)
    adapter = clients.storage_for(Tier(name="gcs", url="gs://bucket/ckpt", rank=1))

    assert isinstance(adapter, GcsStorage)
    assert adapter._client is client
    assert (adapter.bucket_name, adapter.prefix) == ("bucket", "ckpt")
    assert len(asked) == 1


def test_default_factories_build_the_real_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gcs_client.EMULATOR_ENV, NOWHERE)
    monkeypatch.setattr(gcs_client, "_clients", {})
    clients = StorageRegistry()

    s3 = clients.storage_for(s3_tier())
    gcs = clients.storage_for(Tier(name="gcs", url="gs://bucket/ckpt", rank=1))

    assert isinstance(s3, S3Storage) and s3.client.meta.endpoint_url == NOWHERE
    assert isinstance(gcs, GcsStorage) and gcs._client is gcs_client.shared_client()
    clients.close()


def test_a_bad_checksum_mode_is_refused_and_builds_nothing() -> None:
    make = S3Clients()
    with pytest.raises(ValueError, match="request_checksums"):
        StorageRegistry(s3_client=make).storage_for(s3_tier(request_checksums="always"))
    assert make.calls == []


def test_concurrent_first_uses_build_one_adapter() -> None:
    make = S3Clients(delay=0.2)
    clients = StorageRegistry(s3_client=make)
    tier = s3_tier()
    start = threading.Barrier(8)
    got: list[object] = []

    def use() -> None:
        start.wait()
        got.append(clients.storage_for(tier))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(make.calls) == 1
    assert len(got) == 8 and all(adapter is got[0] for adapter in got)


def test_building_one_tier_holds_up_no_other(tmp_path: Path) -> None:
    release = threading.Event()

    def slow(endpoint_url: str | None, config: Config) -> S3Client:
        release.wait(10)
        return new_client(endpoint_url, config)

    clients = StorageRegistry(s3_client=slow)
    building = threading.Thread(target=clients.storage_for, args=(s3_tier(),))
    building.start()
    try:
        began = time.monotonic()
        clients.storage_for(Tier(name="hot", url=f"file://{tmp_path}", rank=0))
        assert time.monotonic() - began < 1.0
    finally:
        release.set()
        building.join()


def test_a_failed_build_is_tried_again() -> None:
    failures = [RuntimeError("no credentials yet")]

    def flaky(endpoint_url: str | None, config: Config) -> S3Client:
        if failures:
            raise failures.pop()
        return new_client(endpoint_url, config)

    clients = StorageRegistry(s3_client=flaky)
    with pytest.raises(RuntimeError, match="no credentials"):
        clients.storage_for(s3_tier())
    assert isinstance(clients.storage_for(s3_tier()), S3Storage)


def test_close_closes_the_s3_clients_and_forgets_the_adapters(tmp_path: Path) -> None:
    make = S3Clients()
    clients = StorageRegistry(s3_client=make)
    s3 = clients.storage_for(s3_tier())
    local = clients.storage_for(Tier(name="hot", url=f"file://{tmp_path}", rank=0))
    clients.storage_for(s3_tier("other", bucket="other"))

    clients.close()

    assert make.closed == 2
    assert clients.storage_for(s3_tier()) is not s3  # built afresh
    assert clients.storage_for(Tier(name="hot", url=f"file://{tmp_path}", rank=0)) is not local
    clients.close()
    assert make.closed == 3


def test_the_least_recently_used_adapter_is_dropped_beyond_the_bound(tmp_path: Path) -> None:
    clients = StorageRegistry(max_adapters=2)
    a, b, c = (Tier(name=n, url=f"file://{tmp_path}/{n}", rank=0) for n in "abc")
    first_a, first_b = clients.storage_for(a), clients.storage_for(b)
    assert clients.storage_for(a) is first_a  # a is now the most recent

    clients.storage_for(c)

    assert clients.storage_for(a) is first_a
    assert clients.storage_for(b) is not first_b
    with pytest.raises(ValueError):
        StorageRegistry(max_adapters=0)
