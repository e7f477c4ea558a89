"""Domain errors: one base class, each subclass carrying the HTTP status it maps to. How
an error is said over HTTP (problem documents, authentication challenges) is the API's."""

from __future__ import annotations


class AppError(Exception):
    """Base of every error the service reports to a user."""

    status = 400
    title = "Bad request"

    def __init__(self, message: str, *, field: str | None = None, **extra: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra  # more members of the problem body (`checkpoint_id`, ...)


class NotFound(AppError):
    status = 404
    title = "Not found"


class Conflict(AppError):
    status = 409
    title = "Conflict"


class Invalid(AppError):
    """Well-formed input that breaks a rule of the contract."""

    status = 422
    title = "Unprocessable entity"


class UnsupportedMedia(AppError):
    """A body sent as something other than the media type the route reads."""

    status = 415
    title = "Unsupported media type"


class Unavailable(AppError):
    status = 503
    title = "Service unavailable"


class Unauthorized(AppError):
    """No usable credentials: missing, malformed, unknown or revoked token."""

    status = 401
    title = "Unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        super().__init__(message)
        self.invalid_token = invalid_token  # a token was sent, and it is no good


class Forbidden(AppError):
    """A valid token without the scope, or outside the projects, that the request needs."""

    status = 403
    title = "Forbidden"

    def __init__(self, message: str, *, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope  # the scope the request needs, when one would do
