"""Small objects read whole through obstore, the Python binding of Rust's object_store.

An import reads the `trainer_state.json` of every Hugging Face checkpoint it adopts:
30,000 of them in the benchmark's tree of 100,000 checkpoints. Through botocore each GET
costs 1.3-1.9 ms of this process's CPU (event hooks, signing and response parsing, all in
Python under the GIL), so the reads were most of an S3 import's time, and more threads
made them slower. obstore signs, sends and reads in Rust with the GIL released: measured
against `rclone serve s3`, 500 such reads cost 0.66 s of CPU through boto3 and 0.18 s
through obstore, and 16 threads read them in 0.12 s instead of 0.67 s.

Credentials and region are boto3's own: obstore's Boto3CredentialProvider draws them from
the session every S3 client here is built from (the same default chain, refreshed before
they expire), so a tier reads with exactly the identity it lists and writes with.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import obstore
from obstore.auth.boto3 import Boto3CredentialProvider
from obstore.exceptions import (
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from app.storage.base import ObjectMissing, PermanentError, PermissionDenied, TransientError
from app.storage.s3.client import shared_session

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

RETRIES: RetryConfig = {"max_retries": 2, "retry_timeout": timedelta(seconds=30)}


class SmallReads:
    """One bucket's small objects, read whole; the store is built on first use."""

    def __init__(self, bucket: str, endpoint_url: str | None, region: str | None) -> None:
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        self._store: S3Store | None = None
        self._lock = threading.Lock()

    def read(self, object_key: str, limit: int, what: str) -> bytes:
        """The object's bytes; PermanentError when it holds more than `limit`. An
        archived object is refused by the provider as a permission (PermissionDenied):
        obstore does not tell the two apart."""
        try:
            result = obstore.get(self._built(), object_key)
            size = int(result.meta["size"])
            if size > limit:
                raise PermanentError(f"{what}: {size} bytes, more than the {limit} read whole")
            return bytes(result.bytes())
        # obstore raises Python's own FileNotFoundError and PermissionError for some answers
        except (NotFoundError, FileNotFoundError):
            raise ObjectMissing(f"{what} does not exist") from None
        except (PermissionDeniedError, UnauthenticatedError, PermissionError) as error:
            raise PermissionDenied(f"{what}: {_first_line(error)}") from None
        except (BaseError, OSError) as error:  # obstore retried what it could (RETRIES)
            raise TransientError(f"{what}: {_first_line(error)}") from None

    def _built(self) -> S3Store:
        with self._lock:
            if self._store is None:
                endpoint = self.endpoint_url
                options: ClientConfig = {
                    "allow_http": bool(endpoint and endpoint.startswith("http://")),
                    "connect_timeout": timedelta(seconds=10),
                    "timeout": timedelta(seconds=120),
                }
                with_session = Boto3CredentialProvider(shared_session())
                self._store = S3Store(
                    self.bucket,
                    endpoint=endpoint,
                    region=self.region,
                    # S3-compatible servers are addressed by path, as the boto3 clients do
                    virtual_hosted_style_request=endpoint is None,
                    client_options=options,
                    retry_config=RETRIES,
                    credential_provider=with_session,
                )
            return self._store


def _first_line(error: BaseException) -> str:
    """obstore's messages run over several lines of context: the first says what failed."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
