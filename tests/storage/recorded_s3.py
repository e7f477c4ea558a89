"""An HTTP endpoint that answers S3 requests with answers written down beforehand, for the
few behaviours of real S3 that neither moto nor `rclone serve s3` has (see
test_full_object_checksums.py): the adapter, its botocore client and its parsers run
unchanged against it; only the server is a recording.

    with RecordedS3(answer) as server:
        storage = S3Storage("bucket", "tier", endpoint_url=server.url)
        ...
        server.requests  # every request, in order

`answer(request)` returns the status, headers and body to send, or None for a 404.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without the query
    query: dict[str, str]  # first value of each parameter ("uploads" -> "")
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def xml(text: str) -> bytes:
    """An S3 XML document: the declaration and S3's namespace around `text`'s root."""
    root_end = text.index(">")
    opened = f'{text[:root_end]} xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{opened}{text[root_end:]}'.encode()


class RecordedS3:
    def __init__(self, answer: Callable[[Request], Answer | None]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(
                    method=self.command,
                    path=parts.path,
                    query={k: v[0] for k, v in parse_qs(parts.query, True).items()},
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length) if length else b"",
                )
                with server._lock:
                    server.requests.append(request)
                found = server.answer(request) or Answer(404, {}, b"")
                self.send_response(found.status)
                for name, value in found.headers.items():
                    self.send_header(name, value)
                # a HEAD's Content-Length is the object's, given by the answer
                if "Content-Length" not in found.headers:
                    self.send_header("Content-Length", str(len(found.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(found.body)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> RecordedS3:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def sent(
        self, method: str, predicate: Callable[[Request], bool] = lambda _r: True
    ) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and predicate(r)]
