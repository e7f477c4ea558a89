"""Registration's fast path: `POST /v1/runs/{run_id}/checkpoints`, the call every training
job makes at every save, answered below Starlette's routing and FastAPI's dependencies.

A sampling profile of one api worker under 32 registering clients found the event loop's
thread the bound, and most of its time in the machinery around the route (middleware,
route matching, resolving the app-wide access check and query check as dependencies) and
in two hand-offs to worker threads, one for the token's lookup and one for the insert.
Here a registration that will succeed costs one hand-off: the token's lookup and the
insert run in the same worker thread.

Only success is answered here. A request this path does not take (a query string, a body
that is not JSON or not valid, no token) and one the service refuses (the token, the run,
an overlap, anything the catalog raises as an AppError) goes on, its body replayed, to the
app's own route, which checks and answers it as it answers every request: one behaviour,
one place for errors. A refused registration wrote nothing, so asking again is safe.
"""

from __future__ import annotations

import re

import anyio
from pydantic import ValidationError
from starlette.datastructures import Headers, State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.auth import RULES, bearer, token_principal
from app.api.checkpoints import make_registration
from app.api.errors import json_media
from app.api.schemas import CheckpointCreate, CheckpointRead
from app.domain.access import ANONYMOUS
from app.domain.errors import AppError

_PATH = re.compile(r"/v1/runs/([^/]+)/checkpoints")
_RULE = RULES["POST", "/v1/runs/{run_id}/checkpoints"]
_JSON = [(b"content-type", b"application/json")]


class FastRegistration:
    """ASGI middleware: successful registrations answered here, everything else passed on."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope["query_string"]:
            found = _PATH.fullmatch(scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before sending it all: no one to answer
        answered = await self._register(scope, found.group(1), body)
        if answered is None:
            await self.app(scope, _replay(body, receive), send)
            return
        status, payload = answered
        length = [(b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": _JSON + length})
        await send({"type": "http.response.body", "body": payload})

    async def _register(self, scope: Scope, run_id: str, body: bytes) -> tuple[int, bytes] | None:
        """(status, body) of a registration made; None for one the route must answer."""
        headers = Headers(scope=scope)
        if not json_media(headers.get("content-type")):
            return None
        secret = None
        if self.state.settings.auth != "off":
            try:
                secret = bearer(headers.get("authorization"))
            except AppError:
                return None
        try:
            checkpoint = CheckpointCreate.model_validate_json(body)
        except ValidationError:
            return None
        try:
            answer, created = await anyio.to_thread.run_sync(
                _authorized_registration, self.state, run_id, checkpoint, secret
            )
        except AppError:
            return None
        self.state.runtime.request_evaluation(run_id)  # committed: evaluate the run
        return (201 if created else 200), answer.model_dump_json(by_alias=True).encode()


def _authorized_registration(
    state: State, run_id: str, checkpoint: CheckpointCreate, secret: str | None
) -> tuple[CheckpointRead, bool]:
    """The token's check (the same as for every request) and the registration, in one
    worker thread. `secret` None: access control is off."""
    actor = ANONYMOUS.actor
    if secret is not None:
        actor = token_principal(state.engine, secret, _RULE, None, ("run", run_id)).actor
    return make_registration(state, run_id, checkpoint, actor)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when the client disconnects first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then listens as before."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
