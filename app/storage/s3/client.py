"""Building an S3 tier's boto3 client: its configuration, and the one session all share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Literal

import boto3
import botocore.auth
import botocore.session
from botocore.config import Config
from botocore.utils import parse_timestamp

from app.storage.s3 import listing_parser

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ChecksumMode = Literal["when_supported", "when_required"]
# (endpoint_url, config) -> a client: how a StorageRegistry is told to build S3 clients.
ClientFactory = Callable[[str | None, Config], "S3Client"]
DEFAULT_CONCURRENCY = 8  # requests one adapter has in flight at once


def checksum_mode(request_checksums: str) -> ChecksumMode:
    """A tier's `request_checksums`, refused unless botocore knows it."""
    if request_checksums not in ("when_supported", "when_required"):
        raise ValueError(f"request_checksums {request_checksums!r}")
    return "when_required" if request_checksums == "when_required" else "when_supported"


def client_config(
    checksums: ChecksumMode,
    *,
    endpoint_url: str | None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Config:
    """The configuration every adapter's client has: botocore retries nothing (the adapter
    retries, once, with retry.retrying) and holds a connection per request in flight."""
    return Config(
        request_checksum_calculation=checksums,
        response_checksum_validation=checksums,
        retries={"total_max_attempts": 1, "mode": "standard"},  # retry.retrying retries
        max_pool_connections=max(10, 2 * concurrency),
        connect_timeout=10,
        # Per socket read, not per request: long enough for S3 to answer a large
        # server-side part copy or a CompleteMultipartUpload.
        read_timeout=120,
        tcp_keepalive=True,
        # S3-compatible servers are addressed by path: their hostnames rarely have a
        # wildcard DNS entry per bucket.
        s3={"addressing_style": "path"} if endpoint_url else None,
    )


def _parse_timestamp(value: str) -> datetime:
    """ISO 8601 (S3's XML) parsed by the standard library, anything else by botocore."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return parse_timestamp(value)
    return parsed if parsed.tzinfo is not None else parse_timestamp(value)


@cache
def _session() -> boto3.session.Session:
    core = botocore.session.get_session()
    # botocore parses each listed object's LastModified with dateutil, about 0.3 ms apiece
    # (most of the time spent on a 1,000-key page, and on deleting a large prefix), and a
    # page's XML twice, through a parser that walks the model per element: listing_parser
    listing_parser.install(core, _parse_timestamp)
    _sign_in_python()
    return boto3.session.Session(botocore_session=core)


def _sign_in_python() -> None:
    """S3 requests signed by botocore's own SigV4 signer, not awscrt's. awscrt is here for
    its CRC64NVME, and its presence makes botocore sign through the CRT, which reads a
    signed body back through Python 4 KiB at a time to hash it: 32,768 calls holding the
    GIL per 128 MiB part, so parallel uploads queued on the lock. botocore's signer hashes
    1 MiB reads with hashlib, which lets the GIL go. A 2 GiB upload of 16 files to a local
    S3 server: 12.1 s and 7.8 s of CPU through the CRT signer, 8.2 s and 2.9 s with this
    one (bench/README.md). Headers and signatures are the same SigV4 either way."""
    botocore.auth.AUTH_TYPE_MAPS["s3v4"] = botocore.auth.S3SigV4Auth


_session_lock = threading.Lock()


def new_client(endpoint_url: str | None, config: Config) -> S3Client:
    """Clients of one shared session, which loads the service model once (a session per
    adapter costs ~0.15 s). Sessions, unlike their clients, are not thread-safe: hence the lock.
    Credentials come from boto3's default chain only."""
    with _session_lock:
        return _session().client("s3", endpoint_url=endpoint_url, config=config)


def shared_session() -> boto3.session.Session:
    """The session every client is built from (its credentials and region), for the few
    requests sent through another library (small_reads)."""
    with _session_lock:
        return _session()


def normal_endpoint(url: str | None) -> str | None:
    """An endpoint as adapters compare them (same_service): no trailing slash."""
    return url.rstrip("/") if url else None
