"""Opaque keyset cursors: a page never skips or repeats rows while others are inserted."""

from __future__ import annotations

import base64
import json
from typing import Any

from app.domain.errors import AppError

MAX_LIMIT = 1000


class BadCursor(AppError):
    status = 400
    title = "Bad cursor"


def encode_cursor(*values: Any) -> str:
    raw = json.dumps(list(values), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *types: type) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(values, list) or len(values) != len(types):
            raise ValueError
        if not all(isinstance(v, t) for v, t in zip(values, types, strict=True)):
            raise ValueError
        return values
    except ValueError:
        raise BadCursor("not a cursor this list handed out", field="cursor") from None
