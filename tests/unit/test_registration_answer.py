"""The fast path answers a new registration with JSON written straight from the rows it
inserted (app.api.fast_registration.written_json); every other path answers with the
`CheckpointRead` model. The two must be the same document, byte for byte, whatever the job
sent: a client cannot tell which path answered it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.convert import checkpoint_read
from app.api.fast_registration import written_json
from app.services.catalog.checkpoints import written_checkpoint

_OFFSETS = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7))])
_INSTANTS = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1), timezones=_OFFSETS
)
_TEXT = st.text(min_size=1, max_size=12)
_FILES = st.lists(
    st.fixed_dictionaries(
        {"path": _TEXT, "size_bytes": st.integers(0, 2**62)},
        optional={"sha256": st.text("0123456789abcdef", min_size=64, max_size=64)},
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(0, 2**63 - 1),
    klass=_TEXT,
    committed=st.booleans(),
    files=_FILES,
    metrics=st.dictionaries(_TEXT, st.floats(allow_nan=False, allow_infinity=False), max_size=3),
    labels=st.dictionaries(_TEXT, _TEXT, max_size=3),
    created_at=_INSTANTS,
    registered_at=_INSTANTS,
    storage_class=st.none() | _TEXT,
    single_file=st.booleans(),
)
def test_the_fast_answer_is_the_model_s_document_byte_for_byte(
    step: int,
    klass: str,
    committed: bool,
    files: list[dict[str, Any]],
    metrics: dict[str, float],
    labels: dict[str, str],
    created_at: datetime,
    registered_at: datetime,
    storage_class: str | None,
    single_file: bool,
) -> None:
    uri = f"s3://bucket/run/step-{step}"
    values: dict[str, Any] = {
        "id": "ckpt_0123456789abcdef",
        "run_id": "run_0123456789abcdef",
        "step": step,
        "klass": klass,
        "state": "active" if committed else "writing",
        "uri": uri,
        "size_bytes": sum(f["size_bytes"] for f in files),
        "files": files,
        "metrics": metrics,
        "labels": labels,
        "pinned": False,
        "pin_reason": None,
        "single_file": single_file,
        "created_at": created_at,
        "registered_at": registered_at,
        "committed_at": registered_at if committed else None,
        "created_by": "token:tok_1:job",
        "updated_by": "token:tok_1:job",
        "reserved_until": None if committed else registered_at + timedelta(minutes=30),
    }
    location = {
        "checkpoint_id": values["id"],
        "tier": "hot",
        "uri": uri,
        "storage_class": storage_class,
        "role": "primary",
    }
    model = checkpoint_read(written_checkpoint(values, location))
    assert written_json(values, location) == model.model_dump_json(by_alias=True).encode()
