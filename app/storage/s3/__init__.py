"""S3 and S3-compatible tiers: the adapter is `S3Storage` (app.storage.s3.adapter)."""

from app.storage.s3.adapter import S3Storage, translate

__all__ = ["S3Storage", "translate"]
