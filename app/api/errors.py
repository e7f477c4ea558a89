"""Every error leaves as application/problem+json (RFC 9457), naming the field at fault."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.auth import authorize
from app.api.schemas import NO_NUL
from app.domain.errors import AppError, Forbidden, Unauthorized, UnsupportedMedia

PROBLEM = "application/problem+json"
log = logging.getLogger("app.api")


def problem(
    status: int, title: str, detail: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    # Only the leading element says where the value came from; a later "path" is a field name
    # (a manifest entry's `path`) and must stay in the answer.
    where = ("body", "query", "path", "header", "cookie")
    parts = (list(loc[1:]) if loc and loc[0] in where else list(loc)) or list(loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def challenge(error: AppError) -> dict[str, str]:
    """RFC 6750's WWW-Authenticate for a refused token: which realm, and what was wrong."""
    if isinstance(error, Unauthorized):
        value = 'Bearer realm="ckpt"'
        return {
            "WWW-Authenticate": value + (', error="invalid_token"' if error.invalid_token else "")
        }
    if isinstance(error, Forbidden) and error.scope is not None:
        value = f'Bearer realm="ckpt", error="insufficient_scope", scope="{error.scope}"'
        return {"WWW-Authenticate": value}
    return {}


async def _app_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, AppError)
    extra = {"field": error.field} if error.field else {}
    extra.update(error.extra)
    named = error.field and not error.message.startswith(error.field)
    detail = f"{error.field}: {error.message}" if named else error.message
    return problem(error.status, error.title, detail, challenge(error) or None, **extra)


def sent_json(request: Request) -> bool:
    return json_media(request.headers.get("content-type"))


def json_media(content_type: str | None) -> bool:
    """Whether a content-type names JSON: application/json or application/...+json."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def not_json(request: Request) -> UnsupportedMedia:
    """The refusal of a body that did not say it is JSON: otherwise it reads as missing."""
    sent = request.headers.get("content-type")
    said = f"it was sent as {sent[:80]!r}" if sent else "it was sent without a content-type"
    return UnsupportedMedia(
        f"body: send it as JSON with 'content-type: application/json' ({said})", field="body"
    )


def _sentence(item: Mapping[str, Any], message: str) -> str:
    """pydantic's message without its machinery: our validators' own words for a
    ValueError, and the choices of a closed set said once."""
    kind = item.get("type")
    if kind in ("value_error", "assertion_error"):
        reason = (item.get("ctx") or {}).get("error")
        return str(reason) if reason is not None else message.split(", ", 1)[-1]
    if kind == "literal_error":
        expected = (item.get("ctx") or {}).get("expected")
        return f"must be one of {expected}" if expected else message
    if kind == "string_pattern_mismatch" and (item.get("ctx") or {}).get("pattern") == NO_NUL:
        return "must not contain NUL characters"  # the one pattern a person cannot read
    return message


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    # FastAPI parses the body before it runs the authorization dependency: a caller who may
    # not make this request learns that (401/403), not what is wrong with its body.
    try:
        await authorize(request)
    except AppError as refused:
        return await _app_error(request, refused)
    errors = error.errors()
    if not sent_json(request) and any(tuple(i.get("loc", ())) == ("body",) for i in errors):
        return await _app_error(request, not_json(request))
    items = []
    malformed = False
    for item in errors:
        loc = tuple(item.get("loc", ()))
        message = str(item.get("msg", "invalid"))
        if item.get("type") == "json_invalid":
            # loc is ("body", <character offset>): the field at fault is the body itself
            malformed = True
            field = "body"
            reason = (item.get("ctx") or {}).get("error")
            where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            message = f"not valid JSON{where}" + (f" ({reason})" if reason else "")
        else:
            field = _field(loc)
            message = _sentence(item, message)
        items.append({"field": field, "message": message})
    detail = "; ".join(f"{i['field']}: {i['message']}" for i in items[:10])
    if malformed:
        return problem(400, "Malformed JSON", detail, field="body", errors=items)
    return problem(
        422,
        "Unprocessable entity",
        detail,
        field=items[0]["field"] if items else None,
        errors=items,
    )


def _allowed(request: Request) -> str | None:
    """Every method of the path, from the document: the router names only those of the first
    route that matched the path (`GET` where `GET, POST` are allowed)."""
    document = request.app.openapi()
    methods = [
        method.upper()
        for template, item in document.get("paths", {}).items()
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), request.url.path)
        for method in item
    ]
    return ", ".join(sorted(set(methods))) or None


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    headers = dict(error.headers or {})
    if error.status_code == 405:
        allow = _allowed(request)
        if allow is not None:
            headers["Allow"] = allow
    return problem(error.status_code, str(error.detail), str(error.detail), headers)


async def _unexpected(_request: Request, error: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=error)
    return problem(500, "Internal server error", "the service failed; see its logs")


def install(app: FastAPI) -> None:
    app.add_exception_handler(AppError, _app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
