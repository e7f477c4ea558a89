"""What the google-cloud-storage library's failures mean to the storage's callers."""

from __future__ import annotations

import requests
from google import resumable_media
from google.api_core import exceptions as api
from google.auth import exceptions as auth_errors
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

from app.storage.base import ObjectMissing, PermissionDenied, StorageError, TransientError

_TRANSIENT_API = (
    api.TooManyRequests,
    api.InternalServerError,
    api.BadGateway,
    api.ServiceUnavailable,
    api.GatewayTimeout,
)
_TRANSIENT_TRANSPORT = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    auth_errors.TransportError,
)
_TRANSIENT = _TRANSIENT_API + _TRANSIENT_TRANSPORT
# The library raises its own media errors, which subclass google.resumable_media's while
# that package is installed; catching both keeps working if either side changes.
_INVALID_RESPONSE = (InvalidResponse, resumable_media.InvalidResponse)
# Everything the library raises for the provider's answers and the transport's failures.
PROVIDER_ERRORS = (
    api.GoogleAPIError,
    requests.exceptions.RequestException,
    auth_errors.GoogleAuthError,
    *_INVALID_RESPONSE,
    DataCorruption,
    resumable_media.DataCorruption,
)


class BatchUnsupported(Exception):
    """The endpoint answered a batch request with something other than one reply a call."""


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def translate(error: BaseException, what: str) -> StorageError:
    """The one place provider errors become StorageError, TransientError or ObjectMissing.
    Messages carry the operation and the provider's reason, never request headers."""
    message = f"{what}: {type(error).__name__}: {error}"
    if isinstance(error, api.NotFound):
        return ObjectMissing(message)
    if isinstance(error, api.Forbidden):
        return PermissionDenied(message)  # rights, a retention policy or a hold
    if isinstance(error, _TRANSIENT):
        return TransientError(message)
    if isinstance(error, api.GoogleAPICallError) and error.code == 408:
        return TransientError(message)  # request timeout: GCS lists it as retryable
    if isinstance(error, _INVALID_RESPONSE):
        status = _status(error)
        if status is not None and (status == 429 or status >= 500):
            return TransientError(message)
        if status == 404:
            return ObjectMissing(message)
        if status == 403:
            return PermissionDenied(message)
    return StorageError(message)
