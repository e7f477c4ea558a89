"""A reverse proxy in front of a test S3 or GCS server that fails requests on demand.

    with FaultyProxy(moto.url) as proxy:
        proxy.fail(2, "slowdown", method="PUT")   # the next two PUTs get 503 SlowDown
        storage = S3Storage(bucket, endpoint_url=proxy.url)

    with FaultyProxy(gcs.url, dialect="gcs") as proxy:
        proxy.randomly(0.2, seed=7)               # from now on 1 request in 5 fails

Faults: "slowdown" (503 SlowDown), "internal" (500 InternalError), "throttle" (429),
"reset" (the connection is reset instead of answered), "timeout" (no answer for `stall`
seconds, then the connection closes: a client reading with a shorter timeout times out),
"truncate" (the request is forwarded and its answer stops halfway through the body, then
the connection closes) and "delete-errors" (S3 only: a DeleteObjects is forwarded, then
answered 200 with its first key reported as not deleted, error code `code`, as S3 does
when one key of a batch fails), and "error-200" (S3 only: 200 with an `<Error>` body, as S3
answers a copy that fails after it began). Only "truncate" and "delete-errors" reach the
server.

The dialect shapes the errors as the provider would (S3's XML or GCS's JSON) and, for GCS,
sends the upstream's own Host (S3 keeps the client's: it is signed) and never fails bucket
metadata reads, which the GCS client library makes from a thread of its own.

`fail` queues faults for the next matching requests; `randomly` fails any other request
with a seeded probability. Every request is recorded in `seen`.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import struct
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal[
    "slowdown",
    "internal",
    "throttle",
    "reset",
    "timeout",
    "truncate",
    "delete-errors",
    "error-200",
]
Dialect = Literal["s3", "gcs"]
# What a provider does to a client now and then; "delete-errors" is an S3 answer, not noise.
RANDOM_KINDS: tuple[FaultKind, ...] = (
    "slowdown",
    "internal",
    "throttle",
    "reset",
    "timeout",
    "truncate",
)

_ERRORS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "throttle": (429, "TooManyRequests", "Please slow down."),
}
_GCS_REASONS = {503: "backendError", 500: "internalError", 429: "rateLimitExceeded"}
# Bucket metadata: the GCS client reads it from a background thread at times no test
# can predict, so random faults leave it alone.
_GCS_BUCKET_METADATA = re.compile(r"^/storage/v1/b/[^/?]+(\?|$)")
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


@dataclass
class _RandomFaults:
    rate: float
    kinds: tuple[FaultKind, ...]
    rng: random.Random

    def draw(self) -> FaultKind | None:
        if self.rng.random() >= self.rate:
            return None
        return self.rng.choice(self.kinds)


class FaultyProxy:
    def __init__(self, upstream: str, *, dialect: Dialect = "s3", stall: float = 2.0) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"{upstream!r} needs a host and a port")
        self.upstream = (parts.hostname, parts.port)
        self.dialect: Dialect = dialect
        self.stall = stall  # how long a "timeout" fault holds a request before hanging up
        self._faults: list[Fault] = []
        self._random: _RandomFaults | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
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
        self._stopping.set()  # "timeout" faults stop holding their requests
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

    def randomly(
        self, rate: float, *, seed: int, kinds: Sequence[FaultKind] = RANDOM_KINDS
    ) -> None:
        """From now on fail each request that no queued fault matches with probability
        `rate`, by a kind drawn from `kinds`; the same seed draws the same sequence."""
        if not 0 <= rate <= 1 or not kinds:
            raise ValueError("rate must be in [0, 1] and kinds not empty")
        if "delete-errors" in kinds and self.dialect != "s3":
            raise ValueError("delete-errors is an S3 answer")
        with self._lock:
            self._random = _RandomFaults(rate, tuple(kinds), random.Random(seed))

    def calm(self) -> None:
        """No more random faults (queued ones still apply)."""
        with self._lock:
            self._random = None

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._random = None
            self.seen.clear()

    def injected(self) -> Counter[str]:
        """Faults answered so far, by kind."""
        with self._lock:
            return Counter(seen.fault for seen in self.seen if seen.fault is not None)

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
            elif self._random is not None and not self._spared(method, path):
                kind = self._random.draw()
                fault = Fault(kind, 1, None, None, "InternalError") if kind else None
            self.seen.append(
                Seen(method, path, fault.kind if fault else None, body if method == "POST" else b"")
            )
            return fault

    def _spared(self, method: str, path: str) -> bool:
        return self.dialect == "gcs" and method == "GET" and bool(_GCS_BUCKET_METADATA.match(path))


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
        elif fault.kind == "timeout":
            self.proxy._stopping.wait(self.proxy.stall)
            self.close_connection = True  # hang up without a word
        elif fault.kind == "truncate":
            self._forward(body, truncate=True)
        elif fault.kind == "delete-errors":
            self._forward(body, answer=False)
            self._delete_errors(body, fault.code)
        elif fault.kind == "error-200":
            code, message = _ERRORS["internal"][1:]
            xml = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
            self._answer(200, xml.encode(), content_type="application/xml")
        else:
            self._error(*_ERRORS[fault.kind])

    def _error(self, status: int, code: str, message: str) -> None:
        if self.proxy.dialect == "gcs":
            reason = _GCS_REASONS.get(status, "backendError")
            error = {
                "error": {
                    "code": status,
                    "message": message,
                    "errors": [{"domain": "global", "reason": reason, "message": message}],
                }
            }
            self._answer(status, json.dumps(error).encode(), content_type="application/json")
            return
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
            # S3: the Host header is passed on unchanged, it is part of the request's
            # signature. GCS: the upstream's own, as the emulator expects.
            keep_host = self.proxy.dialect == "s3"
            upstream.putrequest(
                self.command, self.path, skip_host=keep_host, skip_accept_encoding=True
            )
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS and (keep_host or name.lower() != "host"):
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
