"""A reverse proxy in front of a test S3 server that fails chosen requests on demand.

    with FaultyProxy(moto.url) as proxy:
        proxy.fail(2, "slowdown", method="PUT")   # the next two PUTs get 503 SlowDown
        storage = S3Storage(bucket, endpoint_url=proxy.url)

Faults: "slowdown" (503 SlowDown), "internal" (500 InternalError), "throttle" (429),
"reset" (the connection is reset instead of answered), "truncate" (the answer stops halfway
through its body and the connection closes) and "delete-errors" (a DeleteObjects
is forwarded, then answered 200 with its first key reported as not deleted, error code
`code`, as S3 does when one key of a batch fails). Every request is recorded in `seen`.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal["slowdown", "internal", "throttle", "reset", "truncate", "delete-errors"]

_ERRORS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "throttle": (429, "TooManyRequests", "Please slow down."),
}
# Not forwarded either way: they describe one hop, not the request.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te"}
)


@dataclass
class Fault:
    kind: FaultKind
    remaining: int
    method: str | None
    query: str | None
    code: str

    def matches(self, method: str, query: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.query is None or self.query in query
        )


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    path: str  # with the query string
    fault: FaultKind | None  # None: forwarded
    body: bytes  # POST bodies only (DeleteObjects, CompleteMultipartUpload)


class FaultyProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"{upstream!r} needs a host and a port")
        self.upstream = (parts.hostname, parts.port)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self.seen: list[Seen] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultyProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultyProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def fail(
        self,
        count: int,
        kind: FaultKind = "slowdown",
        *,
        method: str | None = None,
        query: str | None = None,
        code: str = "InternalError",
    ) -> None:
        """Fail the next `count` requests matching `method` and a `query` substring."""
        with self._lock:
            self._faults.append(Fault(kind, count, method, query, code))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self.seen.clear()

    @property
    def requests(self) -> int:
        return len(self.seen)

    def count(self, method: str | None = None, query: str | None = None) -> int:
        """Requests seen (failed or forwarded) with `method` and a `query` substring."""
        with self._lock:
            return sum(
                1
                for seen in self.seen
                if (method is None or seen.method == method)
                and (query is None or query in seen.path.partition("?")[2])
            )

    def _take(self, method: str, path: str, body: bytes) -> Fault | None:
        query = path.partition("?")[2]
        with self._lock:
            fault = next((f for f in self._faults if f.matches(method, query)), None)
            if fault is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
            self.seen.append(
                Seen(method, path, fault.kind if fault else None, body if method == "POST" else b"")
            )
            return fault


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered for us

    def log_message(self, format: str, *args: object) -> None:
        pass

    @property
    def proxy(self) -> FaultyProxy:
        return self.server.proxy  # type: ignore[attr-defined, no-any-return]

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._answer(501, b"chunked request bodies are not supported by this proxy")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self.proxy._take(self.command, self.path, body)
        if fault is None:
            self._forward(body)
        elif fault.kind == "reset":
            self._reset()
        elif fault.kind == "truncate":
            self._forward(body, truncate=True)
        elif fault.kind == "delete-errors":
            self._forward(body, answer=False)
            self._delete_errors(body, fault.code)
        else:
            status, code, message = _ERRORS[fault.kind]
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?>'
                f"<Error><Code>{code}</Code><Message>{message}</Message>"
                "<RequestId>faulty-proxy</RequestId></Error>"
            )
            self._answer(status, xml.encode(), content_type="application/xml")

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset(self) -> None:
        """Close with SO_LINGER 0: the client gets a TCP reset, not an answer."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _delete_errors(self, body: bytes, code: str) -> None:
        keys = re.findall(rb"<Key>(.*?)</Key>", body)
        first = keys[0].decode() if keys else ""
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Error><Key>{first}</Key><Code>{code}</Code><Message>injected</Message></Error>"
            "</DeleteResult>"
        )
        self._answer(200, xml.encode(), content_type="application/xml")

    def _forward(self, body: bytes, *, answer: bool = True, truncate: bool = False) -> None:
        host, port = self.proxy.upstream
        upstream = http.client.HTTPConnection(host, port, timeout=60)
        try:
            # The Host header is passed on unchanged: it is part of the request's signature.
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    upstream.putheader(name, value)
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            data = response.read()
            if not answer:
                return
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_HEADERS and name.lower() != "content-length":
                    self.send_header(name, value)
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if truncate:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()
