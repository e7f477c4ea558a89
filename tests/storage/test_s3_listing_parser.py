"""S3 listing pages are parsed by compiled code instead of botocore's generic parser (most
of an S3 import's CPU went there), to exactly the answer botocore gives: compared call by
call against a plain boto3 client, on moto and on `rclone serve s3`, over keys and
arguments that shape a listing. botocore's check for an error S3 sends with a 200 still
holds, for listings (parsed once now) and for every other operation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config

from app.storage import retry
from app.storage.s3 import S3Storage
from tests.storage.faulty_proxy import FaultyProxy
from tests.storage.s3_servers import (
    S3Endpoint,
    dummy_credentials,
    new_bucket,
    s3_client,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

KEYS = [
    "with space/a.bin",
    "plus+sign",
    "ünïcödé/ключ.bin",
    "percent%2Fencoded",
    "amp&and<lt",
    "deep/er/still/z",
    "deep/er/y",
    "deep/x",
    "marker/",  # a console's folder marker, empty
    "z-last",
]
ARGUMENTS: list[dict[str, Any]] = [
    {},
    {"Delimiter": "/"},
    {"Prefix": "deep/", "Delimiter": "/"},
    {"Prefix": "deep/"},
    {"StartAfter": "m"},
    {"MaxKeys": 3},
    {"MaxKeys": 2, "StartAfter": "deep/er/y", "FetchOwner": True},
    {"EncodingType": "url"},
    {"Prefix": "nothing-here/"},
]


def plain_client(endpoint: S3Endpoint) -> S3Client:
    """boto3 as it comes: a session of its own, botocore's parser."""
    dummy_credentials()
    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1})
    return boto3.session.Session().client("s3", endpoint_url=endpoint.url, config=config)


def answer(client: S3Client, bucket: str, arguments: dict[str, Any]) -> dict[str, Any]:
    found = dict(client.list_objects_v2(Bucket=bucket, **arguments))
    found.pop("ResponseMetadata")  # request ids and dates
    return found


def test_every_listing_parses_to_what_botocore_gives(either_s3: S3Endpoint) -> None:
    bucket = new_bucket(either_s3)
    raw = s3_client(either_s3)
    for key in KEYS:
        raw.put_object(Bucket=bucket, Key=key, Body=b"" if key.endswith("/") else key.encode())
    raw.put_object(Bucket=bucket, Key="deep/sum", Body=b"summed", ChecksumAlgorithm="CRC32")
    ours = S3Storage(bucket, endpoint_url=either_s3.url).client
    plain = plain_client(either_s3)
    for arguments in ARGUMENTS:
        assert answer(ours, bucket, arguments) == answer(plain, bucket, arguments), arguments
    token = answer(ours, bucket, {"MaxKeys": 2})["NextContinuationToken"]
    follow = {"MaxKeys": 4, "ContinuationToken": token}
    assert answer(ours, bucket, follow) == answer(plain, bucket, follow)


@pytest.fixture
def instant_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "backoff", lambda attempt, **_: 0.001)


@pytest.fixture
def proxied(moto_s3: S3Endpoint) -> Iterator[tuple[FaultyProxy, S3Storage]]:
    bucket = new_bucket(moto_s3)
    raw = s3_client(moto_s3)
    for key in ("t/a", "t/b/c", "t/d"):
        raw.put_object(Bucket=bucket, Key=key, Body=b"x")
    with FaultyProxy(moto_s3.url) as proxy:
        yield proxy, S3Storage(bucket, endpoint_url=proxy.url)


@pytest.mark.usefixtures("instant_backoff")
def test_an_error_sent_with_a_200_is_retried_on_a_listing(
    proxied: tuple[FaultyProxy, S3Storage],
) -> None:
    proxy, storage = proxied
    proxy.fail(1, "error-200", method="GET", query="list-type=2")
    assert [info.key for info in storage.iter_prefix("t")] == ["a", "b/c", "d"]
    assert proxy.injected()["error-200"] == 1
    assert proxy.count("GET", "list-type=2") == 2


@pytest.mark.usefixtures("instant_backoff")
def test_an_error_sent_with_a_200_is_retried_on_any_other_operation(
    proxied: tuple[FaultyProxy, S3Storage],
) -> None:
    """A server-side copy, which S3 does answer that way: botocore's own check."""
    proxy, storage = proxied
    proxy.fail(1, "error-200", method="PUT")
    storage.copy_within(storage, "t/a", "t/copied", 1)
    assert proxy.injected()["error-200"] == 1
    with storage.open_read("t/copied") as copied:
        assert copied.read() == b"x"
    storage.upload("t/e", io.BytesIO(b"e"), 1)
    assert [info.key for info in storage.iter_prefix("t")] == ["a", "b/c", "copied", "d", "e"]
