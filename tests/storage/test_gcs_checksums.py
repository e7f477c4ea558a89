"""GCS's crc32c (fake-gcs-server): recorded in a manifest by listing, and a copy verified
against it without a byte read back, a source whose bytes no longer match it caught."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import google_crc32c
import pytest

from app.storage.base import file_entry
from app.storage.gcs import GcsStorage
from app.storage.limits import MiB
from app.storage.transfer import bytes_through, copy_files, verify_files
from tests.storage.faulty_proxy import FaultyProxy
from tests.storage.gcs_server import GcsEndpoint, anonymous_client
from tests.storage.gcs_server import new_bucket as new_gcs_bucket


def crc32c(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


@pytest.fixture
def gcs_proxy(fake_gcs: GcsEndpoint) -> Iterator[FaultyProxy]:
    """Every request seen on its way to the emulator (a read is a `alt=media` GET)."""
    with FaultyProxy(fake_gcs.url, dialect="gcs") as proxy:
        yield proxy


def gcs(endpoint: GcsEndpoint, proxy: FaultyProxy) -> GcsStorage:
    client = anonymous_client(proxy.url)
    return GcsStorage(new_gcs_bucket(endpoint), "tier", chunk_size=MiB, client=client)


def reads(proxy: FaultyProxy) -> list[str]:
    return [seen.path for seen in proxy.seen if "alt=media" in seen.path]


def test_gcs_crc32c_is_recorded_by_listing_and_verifies_a_copy_without_reading_it(
    fake_gcs: GcsEndpoint, gcs_proxy: FaultyProxy
) -> None:
    source, dest = gcs(fake_gcs, gcs_proxy), gcs(fake_gcs, gcs_proxy)
    files = {"model/shard-0": os.urandom(3000), "model/shard-1": os.urandom(9 * MiB)}
    for path, data in files.items():
        source.upload(f"ck/{path}", io.BytesIO(data), len(data))  # the larger one resumable
    manifest = [file_entry(i.key, i) for i in source.list_prefix("ck", checksums=True)]
    assert manifest == [
        {"path": path, "size_bytes": len(data), "crc32c": crc32c(data)}
        for path, data in sorted(files.items())
    ]
    gcs_proxy.clear()
    before = bytes_through()

    copy_files(source, "ck", dest, "ck", manifest, storage_class=None)
    assert verify_files(dest, "ck", manifest, source=source, source_prefix="ck") == []

    assert reads(gcs_proxy) == [] and bytes_through() == before


def test_gcs_copy_of_a_source_that_left_its_manifest_is_caught_without_reading_it(
    fake_gcs: GcsEndpoint, gcs_proxy: FaultyProxy
) -> None:
    source, dest = gcs(fake_gcs, gcs_proxy), gcs(fake_gcs, gcs_proxy)
    data = os.urandom(3000)
    source.upload("ck/a", io.BytesIO(data), len(data))
    manifest = [file_entry(i.key, i) for i in source.list_prefix("ck", checksums=True)]
    other = bytes(b ^ 0xFF for b in data)
    source.upload("ck/a", io.BytesIO(other), len(other))
    gcs_proxy.clear()

    copy_files(source, "ck", dest, "ck", manifest, storage_class=None)
    problems = verify_files(dest, "ck", manifest, source=source, source_prefix="ck")

    assert problems == [f"ck/a has crc32c {crc32c(other)}, the manifest says {crc32c(data)}"]
    assert reads(gcs_proxy) == []
