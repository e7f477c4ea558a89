"""Google Cloud Storage tiers: the adapter is `GcsStorage` (app.storage.gcs.adapter)."""

from app.storage.gcs.adapter import SINGLE_REQUEST_MAX, GcsStorage
from app.storage.gcs.client import EMULATOR_ENV, shared_client
from app.storage.gcs.errors import translate

__all__ = ["EMULATOR_ENV", "SINGLE_REQUEST_MAX", "GcsStorage", "shared_client", "translate"]
