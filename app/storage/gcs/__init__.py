"""Google Cloud Storage tiers: the adapter is `GcsStorage` (app.storage.gcs.adapter)."""

from app.storage.gcs.adapter import EMULATOR_ENV, SINGLE_REQUEST_MAX, GcsStorage, translate

__all__ = ["EMULATOR_ENV", "SINGLE_REQUEST_MAX", "GcsStorage", "translate"]
