"""Domain errors: one base class, each subclass carrying its HTTP status."""

from __future__ import annotations


class AppError(Exception):
    """Base of every error the service reports to a user."""

    status = 400
    title = "Bad request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


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


class Unavailable(AppError):
    status = 503
    title = "Service unavailable"
