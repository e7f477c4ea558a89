"""Create the buckets of the tiers file on the compose stack's emulators (first start).

    python create_buckets.py          # reads CKPT_TIERS_FILE, like the service

Every bucket comes from the tiers file the service itself loads, so the two cannot
disagree. Only emulators and self-hosted stores are touched: an s3:// tier needs an
`endpoint_url` (MinIO), a gs:// tier needs STORAGE_EMULATOR_HOST (fake-gcs-server). A tier
on a real cloud account is skipped with a note: its bucket belongs to whoever provisions
the account, not to a container's first start. Safe to run again: existing buckets are kept.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.exceptions import ConnectionError as S3ConnectionError
from google.api_core import exceptions as gcs_errors
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from requests.exceptions import ConnectionError as GcsConnectionError

from app.domain.tier import Tier
from app.settings import load_settings
from app.tiers_config import load_tiers

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
WAIT_SECONDS = 60.0  # the stores may still be starting when this runs


def _retry_until_up(create: Callable[[], str], what: str) -> str:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            return create()
        except (S3ConnectionError, GcsConnectionError) as error:
            if time.monotonic() > deadline:
                message = f"{what}: store unreachable for {WAIT_SECONDS:.0f}s: {error}"
                raise SystemExit(message) from None
            time.sleep(1)


def create_s3_bucket(endpoint_url: str, bucket: str) -> str:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"}),
    )
    try:
        client.head_bucket(Bucket=bucket)
        return "exists"  # asked first: S3 in us-east-1 (and moto) answer 200 to a re-create
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("404", "NoSuchBucket"):
            raise
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as error:
        if error.response["Error"]["Code"] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            return "exists"  # another run made it in between
        raise
    return "created"


def create_gcs_bucket(bucket: str) -> str:
    client = storage.Client(project="emulator", credentials=AnonymousCredentials())
    try:
        # no library retries: an emulator still starting is retried by _retry_until_up
        client.create_bucket(bucket, retry=None, timeout=10)
    except gcs_errors.Conflict:
        return "exists"
    return "created"


def bucket_jobs(tiers: list[Tier]) -> list[tuple[str, Callable[[], str] | None]]:
    """(bucket url, how to create it or None to skip it), each bucket once."""
    jobs: dict[str, Callable[[], str] | None] = {}
    for tier in tiers:
        parsed = tier.parsed
        where = f"{parsed.scheme}://{parsed.bucket}"
        if parsed.scheme == "s3" and tier.endpoint_url:
            endpoint = tier.endpoint_url
            where += f" at {endpoint}"
            jobs.setdefault(where, lambda e=endpoint, b=parsed.bucket: create_s3_bucket(e, b))
        elif parsed.scheme == "gs" and os.environ.get(EMULATOR_ENV):
            jobs.setdefault(where, lambda b=parsed.bucket: create_gcs_bucket(b))
        elif parsed.scheme != "file":
            jobs.setdefault(where, None)
    return list(jobs.items())


def main() -> int:
    tiers = load_tiers(load_settings())
    for where, create in bucket_jobs(tiers):
        if create is None:
            print(f"{where}: skipped (a real provider: buckets are provisioned, not created here)")
            continue
        print(f"{where}: {_retry_until_up(create, where)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
