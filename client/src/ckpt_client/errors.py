"""What the catalog refused, and when it could not be reached.

Every refusal of the service is an RFC 9457 problem document; the exception keeps it whole
(`.problem`) so a caller can read the field at fault (`problem["field"]`) or the checkpoint
a conflict names (`problem["checkpoint_id"]`) without parsing the message.
"""

from __future__ import annotations

from typing import Any


class CatalogError(Exception):
    """The base of every error this client raises about the catalog.

    `status` is the HTTP status of the answer (None when there was no answer), `problem`
    the problem+json body as sent ({} when the answer carried none)."""

    def __init__(
        self, message: str, *, status: int | None = None, problem: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem: dict[str, Any] = dict(problem or {})

    @property
    def field(self) -> str | None:
        """The request field the service named as at fault, if it named one."""
        value = self.problem.get("field")
        return value if isinstance(value, str) else None


class Conflict(CatalogError):
    """409: the request contradicts the catalog (a step registered with other content, a
    location inside another checkpoint's, a reservation that is no longer `writing`)."""


class NotFound(CatalogError):
    """404: an id that names nothing (or a route this service does not have)."""


class Unauthorized(CatalogError):
    """401: no token, or one the service does not know (set CKPT_TOKEN)."""


class Forbidden(CatalogError):
    """403: the token lacks the scope, or the project, this request needs."""


class Invalid(CatalogError):
    """422: the request is malformed in a way the service names (`.field`)."""


class Unavailable(CatalogError):
    """The service could not be reached, or kept failing (5xx, 429), until the call's
    deadline. `status` is the last answer's status, None when none came."""


class RestoreFailed(CatalogError):
    """Staging a checkpoint onto a tier ended without a copy there (the action `failed` or
    was `cancelled`); `.problem` holds the action as the service reported it."""


_BY_STATUS: dict[int, type[CatalogError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
}


def error_for(status: int, problem: dict[str, Any], what: str) -> CatalogError:
    """The exception for a refusal: `what` says which call ("POST /v1/runs")."""
    kind = _BY_STATUS.get(status, CatalogError)
    detail = problem.get("detail") or problem.get("title") or "refused"
    return kind(f"{what}: {status} {detail}", status=status, problem=problem)
