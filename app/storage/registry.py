"""From a tier to the adapter that reaches its objects: one adapter, one client, per tier."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from app.domain.provider import ProviderSettings
from app.domain.tier import Tier
from app.storage.base import Storage
from app.storage.local import LocalStorage

if TYPE_CHECKING:
    from app.storage.gcs.client import ClientFactory as GcsClientFactory
    from app.storage.s3.client import ClientFactory as S3ClientFactory

MAX_ADAPTERS = 64


class _Where(NamedTuple):
    """What an adapter is built from: tiers that agree on all of it share one."""

    scheme: str
    bucket: str
    path: str
    endpoint_url: str | None
    request_checksums: str
    provider: ProviderSettings


class StorageRegistry:
    """The adapters of the tiers one process reaches, each built on first use and kept.

    An adapter holds a client, whose connection pool serves every request of the tier:
    building one per call would open fresh connections each time (and for GCS resolve the
    credentials again). Tiers that agree on scheme, bucket, path, endpoint and request
    checksums share an adapter. Safe to use
    from many threads: an adapter is built once however many ask at once, and building one
    (resolving GCS credentials, say) holds up no one asking for another tier. At most
    `max_adapters` are kept, the least recently used dropped first; a dropped adapter is
    not closed, since a caller may still hold it.

    Clients come from the factories given, by default those building the real clients:
    `s3_client(endpoint_url, config)` (default app.storage.s3.client.new_client, with the
    tier's endpoint and client_config) and `gcs_client()` (default
    app.storage.gcs.client.shared_client: one client per process and emulator host).
    boto3 and google-cloud-storage are imported when a tier first needs them.
    """

    def __init__(
        self,
        *,
        s3_client: S3ClientFactory | None = None,
        gcs_client: GcsClientFactory | None = None,
        max_adapters: int = MAX_ADAPTERS,
    ) -> None:
        if max_adapters < 1:
            raise ValueError("max_adapters must be at least 1")
        self._s3_client = s3_client
        self._gcs_client = gcs_client
        self._max = max_adapters
        self._lock = threading.Lock()
        self._adapters: OrderedDict[_Where, Storage] = OrderedDict()
        self._closers: dict[_Where, Callable[[], None]] = {}  # what close() closes
        self._building: dict[_Where, threading.Lock] = {}

    def storage_for(self, tier: Tier) -> Storage:
        """The adapter of `tier`, built on first use."""
        parsed = tier.parsed
        where = _Where(
            parsed.scheme,
            parsed.bucket,
            parsed.path,
            tier.endpoint_url,
            tier.request_checksums,
            tier.provider,
        )
        with self._lock:
            adapter = self._kept(where)
            if adapter is not None:
                return adapter
            building = self._building.setdefault(where, threading.Lock())
        with building:
            with self._lock:
                adapter = self._kept(where)
            if adapter is not None:
                return adapter  # built by whoever held `building` before us
            try:
                adapter, close = self._build(where)
            except BaseException:
                with self._lock:
                    self._building.pop(where, None)
                raise
            with self._lock:
                self._adapters[where] = adapter
                if close is not None:
                    self._closers[where] = close
                self._building.pop(where, None)
                while len(self._adapters) > self._max:
                    dropped, _ = self._adapters.popitem(last=False)
                    self._closers.pop(dropped, None)
        return adapter

    def close(self) -> None:
        """Close the S3 clients of the adapters kept, and forget every adapter: the next
        storage_for builds afresh. GCS clients stay open: the default one is shared by the
        whole process, and a factory's own are its caller's to close."""
        with self._lock:
            closers = list(self._closers.values())
            self._adapters.clear()
            self._closers.clear()
        for close in closers:
            close()

    def _kept(self, where: _Where) -> Storage | None:
        adapter = self._adapters.get(where)
        if adapter is not None:
            self._adapters.move_to_end(where)
        return adapter

    def _build(self, where: _Where) -> tuple[Storage, Callable[[], None] | None]:
        """The adapter, and how to close its client when this registry owns it."""
        if where.scheme == "file":
            return LocalStorage(where.path), None
        if where.scheme == "s3":
            # boto3 is slow to import; only when a tier needs it.
            from app.storage.s3 import S3Storage, client

            checksums = client.checksum_mode(where.request_checksums)
            config = client.client_config(checksums, endpoint_url=where.endpoint_url)
            make = self._s3_client or client.new_client
            s3 = S3Storage(
                where.bucket,
                where.path,
                endpoint_url=where.endpoint_url,
                request_checksums=where.request_checksums,
                client=make(where.endpoint_url, config),
                provider=where.provider,
            )
            return s3, s3.client.close
        from app.storage.gcs import GcsStorage, shared_client

        gcs = GcsStorage(
            where.bucket,
            where.path,
            client=(self._gcs_client or shared_client)(),
            provider=where.provider,
        )
        return gcs, None
