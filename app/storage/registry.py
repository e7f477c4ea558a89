"""From a tier to the adapter that reaches its objects (one adapter, one client, per tier)."""

from __future__ import annotations

from functools import lru_cache

from app.domain.tier import Tier
from app.storage.base import Storage
from app.storage.local import LocalStorage


def storage_for(tier: Tier) -> Storage:
    parsed = tier.parsed
    return _adapter(
        parsed.scheme, parsed.bucket, parsed.path, tier.endpoint_url, tier.request_checksums
    )


@lru_cache(maxsize=64)
def _adapter(
    scheme: str, bucket: str, path: str, endpoint_url: str | None, request_checksums: str
) -> Storage:
    if scheme == "file":
        return LocalStorage(path)
    if scheme == "s3":
        from app.storage.s3 import S3Storage  # boto3 is slow to import; only when needed

        return S3Storage(
            bucket, path, endpoint_url=endpoint_url, request_checksums=request_checksums
        )
    from app.storage.gcs import GcsStorage

    return GcsStorage(bucket, path)
