"""Deleting every generation of an object on a versioned GCS bucket.

With Object Versioning a delete makes the live generation noncurrent and keeps it, billed,
until the bucket's lifecycle removes it. A purge means the bytes are gone, so on a tier
that says `versioned: true` (and not `keep_versions`) the adapter lists what generations
are left under the checkpoint and deletes each by number. Soft delete is another matter:
no request removes a soft-deleted object before its retention, so those bytes are billed
whatever the service does (`soft_delete` on the tier puts them in the cost reports).

fake-gcs-server accepts the versioning flag but keeps no noncurrent generations, so the
tests see this listing come back empty there."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol, TypeVar

from google.api_core import exceptions as api
from google.cloud import storage as gcs

T = TypeVar("T")


class Adapter(Protocol):
    """What of GcsStorage this needs (the adapter imports this module)."""

    _client: gcs.Client
    _bucket: gcs.Bucket

    def _url(self, name: str) -> str: ...

    def _call(self, what: str, call: Callable[[], T]) -> T: ...


def remove_generations(storage: Adapter, start: str, names: set[str] | None = None) -> int:
    """Delete every generation left under the object-name prefix `start` (only of `names`
    when given); returns how many went."""
    what = f"list generations {storage._url(start)}"
    left = storage._call(
        what,
        lambda: [
            (blob.name, blob.generation)
            for blob in storage._client.list_blobs(
                storage._bucket, prefix=start, versions=True, retry=None
            )
            if names is None or blob.name in names
        ],
    )
    for name, generation in left:

        def delete(name: str = name, generation: int | None = generation) -> None:
            with contextlib.suppress(api.NotFound):
                storage._bucket.delete_blob(name, generation=generation, retry=None)

        storage._call(f"delete {storage._url(name)} generation {generation}", delete)
    return len(left)
