"""From a tier to the adapter that reaches its objects."""

from __future__ import annotations

from app.domain.errors import Invalid
from app.domain.tier import Tier
from app.storage.base import Storage
from app.storage.local import LocalStorage


def storage_for(tier: Tier) -> Storage:
    if tier.is_local:
        return LocalStorage(tier.parsed.path)
    raise Invalid(
        f"tier {tier.name!r} is an object store; listing it is not supported yet, "
        "so send the manifest in `files`",
        field="files",
    )
