"""The google-cloud-storage client of GCS tiers: one per process and emulator host."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from app.storage.gcs.errors import PROVIDER_ERRORS, translate

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "emulator"  # emulators ignore the project but the client wants one
# () -> a client: how a StorageRegistry is told to build GCS clients (default shared_client).
ClientFactory = Callable[[], storage.Client]

_clients: dict[str, storage.Client] = {}
_clients_lock = threading.Lock()


def shared_client() -> storage.Client:
    """One client per process and emulator host: clients are thread-safe for requests and
    creating one resolves credentials, which is slow. Emulators take no credentials."""
    emulator = os.environ.get(EMULATOR_ENV, "")
    with _clients_lock:
        client = _clients.get(emulator)
        if client is None:
            try:
                if emulator:
                    client = storage.Client(
                        project=EMULATOR_PROJECT,
                        credentials=AnonymousCredentials(),
                    )
                else:
                    client = storage.Client()
            except PROVIDER_ERRORS as error:  # no credentials found, say
                raise translate(error, "create a GCS client") from error
            _clients[emulator] = client
        return client
