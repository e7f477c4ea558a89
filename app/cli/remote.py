"""How a `ckpt` command that reads or changes the catalog reaches it: over HTTP, through the
client library's transport, so that an admin runs it from a laptop against production just
as on the service's own machine. Only the commands that *are* the service (serve, api,
scheduler, worker, migrate) open the database; everything else asks the API, with the
same authorization as any other caller, and so creates nothing where it is run.

A person is waiting, so a call retries what may be transient (connection errors, 429,
5xx) only for a short deadline (`--timeout`, 15 s by default, not the library's 60) and
never spools: past it, the command says the catalog is unreachable and exits 3. The exit
codes are what a script tests:

    0  done
    1  refused by the service (a 4xx: the problem's title and detail on stderr)
    2  usage (Typer's own, and values refused before anything is sent)
    3  unreachable (nothing answered in time, or the service kept failing)
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import Callable
from typing import Annotated, Any, Concatenate, ParamSpec
from urllib.parse import urlsplit

import typer

from ckpt_client.errors import CatalogError, Unauthorized, Unavailable
from ckpt_client.transport import VERSION, Transport, redact, segment

DEFAULT_URL = "http://127.0.0.1:8000"  # as the client library's, and CKPT_PORT's default
DEFAULT_TIMEOUT = 15.0
# A sweep, a reconciliation or a plan of a big catalog answers when it is done: once the
# service has answered a health check, such a call may take this long.
SLOW_DEADLINE = 30 * 60.0
PAGE_LIMIT = 1000  # the API's largest page

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

P = ParamSpec("P")
__all__ = ["Remote", "connected", "explain", "segment", "usage"]


class Remote:
    """The catalog service one command talks to: its transport, and the calls it makes."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.timeout = timeout
        # Each attempt may last as long as a slow call's deadline; a quick call's own
        # deadline (`timeout` from now) cuts its attempts shorter.
        self.transport = Transport(
            url,
            token=token,
            timeout=SLOW_DEADLINE,
            deadline=timeout,
            backoff=0.1,
            max_backoff=2.0,
            user_agent=f"ckpt-cli/{VERSION}",
        )
        self.url = self.transport.shown_url

    def close(self) -> None:
        self.transport.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        slow: bool = False,
        idempotent: bool = True,
    ) -> Any:
        """The body of the answer (None when empty). A `slow` call (a sweep, a scan) first
        makes sure the service answers at all within the short deadline, then waits for
        its answer as long as SLOW_DEADLINE: an unreachable service is said at once, a
        busy one is waited for."""
        try:
            if slow:
                self.transport.request("GET", "/healthz")
                until = time.monotonic() + max(self.timeout, SLOW_DEADLINE)
                return self.transport.request(
                    method, path, json=json, params=params, deadline_at=until
                ).body
            return self.transport.request(
                method, path, json=json, params=params, idempotent=idempotent
            ).body
        except ValueError:  # a 2xx that is not JSON: a web page, not the catalog's API
            raise Unavailable(
                f"{method} {path}: {self.url} answered, but not with JSON: is --url the "
                "catalog service?"
            ) from None

    def items(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The items of a list endpoint, following `next_cursor` until `limit` items (None:
        all of them)."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while limit is None or len(found) < limit:
            size = PAGE_LIMIT if limit is None else min(PAGE_LIMIT, limit - len(found))
            query = {k: v for k, v in (params or {}).items() if v is not None}
            query["limit"] = size
            if cursor:
                query["cursor"] = cursor
            page = self.call("GET", path, params=query)
            found.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return found


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def explain(error: CatalogError) -> typer.Exit:
    """Say what went wrong on stderr, on one line, and return the exit to raise."""
    if isinstance(error, Unavailable):
        typer.echo(f"ckpt: unreachable: {one_line(str(error))}", err=True)
        return typer.Exit(EXIT_UNREACHABLE)
    problem = error.problem
    title = problem.get("title") or f"HTTP {error.status}"
    detail = problem.get("detail") or ""
    message = f"{title}: {detail}" if detail and detail != title else str(title)
    if isinstance(error, Unauthorized):
        message += " (give a token with --token or CKPT_TOKEN)"
    typer.echo(f"ckpt: {one_line(message)}", err=True)
    return typer.Exit(EXIT_REFUSED)


def usage(message: str) -> typer.Exit:
    """A value refused before anything is sent: `ckpt: <message>`, exit 2."""
    typer.echo(f"ckpt: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


# --- the connection options ----------------------------------------------------------------

URL_HELP = f"the catalog service [CKPT_URL, else {DEFAULT_URL}]"
TOKEN_HELP = "an API token [CKPT_TOKEN]; prefer the variable: options show in ps"
TIMEOUT_HELP = f"seconds to keep trying an unreachable service [{DEFAULT_TIMEOUT:g}]"
PANEL = "Connection"

UrlOption = Annotated[
    str | None, typer.Option("--url", help=URL_HELP, rich_help_panel=PANEL, show_default=False)
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", help=TOKEN_HELP, rich_help_panel=PANEL, show_default=False),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout", min=0.1, help=TIMEOUT_HELP, rich_help_panel=PANEL, show_default=False
    ),
]
_OPTIONS = (("ckpt_url", UrlOption), ("ckpt_token", TokenOption), ("ckpt_timeout", TimeoutOption))


def open_remote(
    url: str | None,
    token: str | None,
    timeout: float | None,
    context: typer.Context | None = None,
) -> Remote:
    """The service named by the command's options, else the root command's (`ckpt --url U
    runs list`), else the environment."""
    given = context.find_root().params if context is not None else {}
    url = url or given.get("ckpt_url") or os.environ.get("CKPT_URL") or DEFAULT_URL
    token = token or given.get("ckpt_token") or os.environ.get("CKPT_TOKEN") or None
    timeout = timeout or given.get("ckpt_timeout") or DEFAULT_TIMEOUT
    given_url, url = url, url.rstrip("/")
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise usage(f"--url: an http:// or https:// address, not {redact(given_url)!r}")
    return Remote(url, token, timeout)


def connected(command: Callable[Concatenate[Remote, P], None]) -> Callable[..., None]:
    """A command that talks to the catalog: it takes the Remote first and gets the
    connection options (--url, --token, --timeout) added to its own; whatever the service
    refuses, or an unreachable service, becomes a one-line message and its exit code,
    never a traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        remote = open_remote(
            kwargs.pop("ckpt_url"),
            kwargs.pop("ckpt_token"),
            kwargs.pop("ckpt_timeout"),
            kwargs.pop("ckpt_context"),
        )
        try:
            command(remote, *args, **kwargs)
        except CatalogError as error:
            raise explain(error) from None
        finally:
            remote.close()

    own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in _OPTIONS
    ]
    context = inspect.Parameter(
        "ckpt_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context
    )
    run.__signature__ = inspect.Signature([*own, *extra, context])  # type: ignore[attr-defined]
    return run


def root_options(
    ckpt_url: UrlOption = None, ckpt_token: TokenOption = None, ckpt_timeout: TimeoutOption = None
) -> None:
    """Checkpoint retention and lifecycle service.

    Every command but serve, api, scheduler, worker and migrate talks to the service over
    HTTP (--url, --token, --timeout here or after the command). Exit codes: 0 done, 1
    refused by the service, 2 usage, 3 service unreachable."""
