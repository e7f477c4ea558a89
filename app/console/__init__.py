"""The admin console (DESIGN section 15): static pages that are a client of the public
`/v1` API and nothing else, served by the API process at `/console`.

Everything the pages load ships in this package (no CDN, no Node build), and each answer
carries a Content-Security-Policy that lets a page reach its own origin only, so a
stray link to elsewhere fails in the browser instead of leaking a request. The pages
are open to anyone: what they show is what the token the user gives them may read.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from app.domain.errors import NotFound

router = APIRouter(include_in_schema=False)

STATIC = resources.files(__package__) / "static"
MEDIA = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
# the page's own origin only; inline styles are the charts' (SVG attributes set by script)
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(path: str) -> Response:
    parts = PurePosixPath(path).parts
    if not parts or any(part in ("..", "") or part.startswith(".") for part in parts):
        raise NotFound(f"no console asset {path!r}")
    media = MEDIA.get(PurePosixPath(path).suffix)
    target = STATIC.joinpath(*parts)
    if media is None or not target.is_file():
        raise NotFound(f"no console asset {path!r}")
    return Response(target.read_bytes(), media_type=media, headers=HEADERS)


@router.get("/")
def root() -> RedirectResponse:
    """A person who opens the service's address finds the console."""
    return RedirectResponse("/console/", status_code=307)


@router.get("/console")
def console_bare() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=307)


@router.get("/console/")
def console_page() -> Response:
    return _asset("index.html")


@router.get("/console/{asset:path}")
def console_asset(asset: str) -> Response:
    """A script, stylesheet or vendored library of the console."""
    return _asset(asset)
