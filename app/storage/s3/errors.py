"""What botocore's and urllib3's failures mean to the storage's callers.

One place decides, for every S3 request and for failures in the middle of a body: worth
another try (TransientError), missing (ObjectMissing), refused (PermissionDenied), archived
(ArchivedObject), or plainly failed (StorageError).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import urllib3.exceptions
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from app.storage.base import (
    ArchivedObject,
    ObjectMissing,
    PermissionDenied,
    StorageError,
    TransientError,
)

T = TypeVar("T")

# Error codes worth another try. RequestTimeTooSkewed is left out on purpose: botocore does
# not correct for clock skew, so every attempt would be refused the same way; it surfaces at
# once as a StorageError that names the clock.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
PERMISSION_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId"})


def error_code(error: ClientError) -> str:
    """The S3 error code of a refused request ("NoSuchKey", "SlowDown"...)."""
    return str(error.response.get("Error", {}).get("Code", ""))


def translate(error: BaseException, what: str) -> StorageError:
    """One place that decides what a botocore/urllib3 failure means to our callers."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, ClientError):
        code = error_code(error)
        message = str(error.response.get("Error", {}).get("Message", "") or "")
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"{what}: {code or status}" + (f" {message}" if message else "")
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientError(text)
        if code in MISSING_CODES:
            return ObjectMissing(text)
        if code == "InvalidObjectState":  # a 403 too, but a restore heals it
            return ArchivedObject(text)
        if status == 403 or code in PERMISSION_CODES:
            return PermissionDenied(text)  # rights, an object lock or a legal hold
        if code == "RequestTimeTooSkewed":
            return StorageError(f"{text} (the local clock differs from the server's)")
        return StorageError(text)
    if isinstance(error, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(error):
        return StorageError(f"{what}: {error}")
    if isinstance(
        error,
        BotoConnectionError  # endpoint unreachable, connect timeout, SSL EOF, proxy
        | HTTPClientError  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
        | IncompleteReadError
        | ChecksumError
        | FlexibleChecksumError  # bytes damaged in transit; a new request may do better
        | urllib3.exceptions.ProtocolError
        | urllib3.exceptions.TimeoutError
        | OSError,  # ConnectionResetError, TimeoutError from a socket mid-stream
    ):
        return TransientError(f"{what}: {type(error).__name__}: {error}")
    return StorageError(f"{what}: {type(error).__name__}: {error}")


# What botocore raises for the provider's answers and the network's failures. Our own errors
# (a StorageError from a body stream, say) pass through as they are.
FAILURES = (ClientError, BotoCoreError, urllib3.exceptions.HTTPError, OSError)


def call_translated(what: str, call: Callable[[], T]) -> T:
    """`call()`, its failures translated (no retry here: S3Calls._request retries)."""
    try:
        return call()
    except FAILURES as error:
        raise translate(error, what) from error
