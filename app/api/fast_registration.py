"""Registration's fast path: `POST /v1/runs/{run_id}/checkpoints`, the call every training
job makes at every save, answered below Starlette's routing and FastAPI's dependencies.

A sampling profile of one api worker under 32 registering clients found the event loop's
thread the bound, and most of its time in the machinery around the route (middleware,
route matching, resolving the app-wide access check and query check as dependencies) and
in hand-offs to worker threads, forty of which then took turns at the interpreter lock
around their queries. So on PostgreSQL a registration that sends its manifest stays on
the event loop, with a connection of its own pool (app.db.event_loop_pool), and is one
statement: the token is looked up the first time this process sees it, and after that the
insert itself checks that it is still live and allowed on the run's project. A local
tier's file-system checks run on the loop too when every local tier is on a disk of this
machine (app.storage.mounts); on a network file system they go to a small pool of threads,
so that a server that stalls stalls registrations to it and not the whole service. On
SQLite, and for a
registration that leaves the listing to the service, the token's lookup and the insert
share one worker thread.

Only success is answered here. A request this path does not take (a query string, a body
that is not JSON or not valid, no token) and one the service refuses (the token, the run,
an overlap, anything the catalog raises as an AppError) goes on, its body replayed, to the
app's own route, which checks and answers it as it answers every request: one behaviour,
one place for errors. A refused registration wrote nothing, so asking again is safe.
"""

from __future__ import annotations

import asyncio
import functools
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
import psycopg
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from starlette.datastructures import Headers, State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.auth import RULES, allowed_principal, bearer, token_principal
from app.api.checkpoints import make_registration, registration_of
from app.api.errors import json_media
from app.api.schemas import CheckpointCreate, CheckpointRead
from app.domain.access import ANONYMOUS, Principal
from app.domain.errors import AppError
from app.services.catalog.checkpoints import Rows, supplied_rows
from app.services.catalog.registration import Caller, insert_checkpoint_async
from app.services.catalog.tokens import TokenMatch, hash_secret, lookup_statement, token_match

_PATH = re.compile(r"/v1/runs/([^/]+)/checkpoints")
_RULE = RULES["POST", "/v1/runs/{run_id}/checkpoints"]
_FILE_SYSTEM = ThreadPoolExecutor(max_workers=2, thread_name_prefix="registration-files")
_JSON = [(b"content-type", b"application/json")]


class FastRegistration:
    """ASGI middleware: successful registrations answered here, everything else passed on."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state
        self.callers = KnownCallers()

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
        on_loop = self.state.event_loop_pool
        pool = on_loop.here() if on_loop is not None else None
        try:
            if pool is not None and checkpoint.files is not None:
                written = await _registration_on_loop(
                    self.state, pool, run_id, checkpoint, secret, self.callers
                )
                if written is None:
                    return None
                self.state.runtime.request_evaluation(run_id)  # committed: evaluate the run
                return 201, written_json(*written)
            answer, created = await anyio.to_thread.run_sync(
                _authorized_registration, self.state, run_id, checkpoint, secret
            )
        except (AppError, psycopg.Error):
            return None
        self.state.runtime.request_evaluation(run_id)  # committed: evaluate the run
        return (201 if created else 200), answer.model_dump_json(by_alias=True).encode()


async def _registration_on_loop(
    state: State,
    pool: AsyncConnectionPool[Any],
    run_id: str,
    checkpoint: CheckpointCreate,
    secret: str | None,
    callers: KnownCallers,
) -> Rows | None:
    """A new checkpoint with its manifest, on PostgreSQL, on the event loop: the insert on
    one of its connections (after the token's lookup, the first time this process sees the
    token), the file system (a local tier's uri and symlinks) in a worker thread. None
    when the step is already registered or the token is refused: the route answers that
    (the same content again, a reservation to commit or take back, 401 or 403)."""
    async with pool.connection() as connection:
        actor, caller = ANONYMOUS.actor, None
        if secret is not None:
            secret_hash = hash_secret(secret)
            known = callers.get(secret_hash)
            if known is None:
                sql, params = lookup_statement(secret, ("run", run_id), pyformat=True)
                found = await (await connection.execute(sql, params)).fetchone()
                known = allowed_principal(token_match(found), _RULE, None)
                callers.remember(secret_hash, known)
            else:
                allowed_principal(TokenMatch(known, None), _RULE, None)  # its scopes
                assert known.token_id is not None
                caller = Caller(known.token_id, known.projects)  # the rest: in the insert
            actor = known.actor
        rows = functools.partial(
            supplied_rows,
            state.tiers,
            state.storages,
            run_id,
            registration_of(checkpoint),
            actor=actor,
            now=datetime.now(UTC),
            reservation_ttl=state.settings.reservation_ttl,
        )
        if checkpoint.uri.startswith("file:") and not state.files_on_loop:
            values, location = await asyncio.get_running_loop().run_in_executor(_FILE_SYSTEM, rows)
        else:  # an object store's is checked without I/O; a local disk's in microseconds
            values, location = rows()
        if not await insert_checkpoint_async(connection, values, location, caller):
            return None
    return values, location


def written_json(values: dict[str, Any], location: dict[str, Any]) -> bytes:
    """The answer to a new registration, from the rows it wrote: the document
    `CheckpointRead` makes of them (a test holds the two equal, byte for byte), without
    building the ORM object and the model in between."""
    return orjson.dumps(
        {
            "id": values["id"],
            "run_id": values["run_id"],
            "step": values["step"],
            "class": values["klass"],
            "state": values["state"],
            "uri": values["uri"],
            "size_bytes": values["size_bytes"],
            "files": values["files"],
            "metrics": values["metrics"],
            "labels": values["labels"],
            "pinned": False,
            "pin_reason": None,
            "created_at": values["created_at"],
            "tier": location["tier"],
            "locations": [
                {
                    "tier": location["tier"],
                    "uri": location["uri"],
                    "storage_class": location["storage_class"],
                    "role": location["role"],
                }
            ],
            "created_by": values["created_by"],
            "updated_by": values["updated_by"],
            "health": "ok",
            "health_detail": None,
            "protected_until": None,
            "locked_until": None,
            "lock_reason": None,
            "reserved_until": values["reserved_until"],
        },
        option=orjson.OPT_UTC_Z,
    )


def _authorized_registration(
    state: State, run_id: str, checkpoint: CheckpointCreate, secret: str | None
) -> tuple[CheckpointRead, bool]:
    """The token's check (the same as for every request) and the registration, in one
    worker thread. `secret` None: access control is off."""
    actor = ANONYMOUS.actor
    if secret is not None:
        actor = token_principal(state.engine, secret, _RULE, None, ("run", run_id)).actor
    return make_registration(state, run_id, checkpoint, actor)


class KnownCallers:
    """The tokens this process has looked up for a registration, by their secret's hash.
    A token's scopes and projects never change, so the lookup is not made again; what can
    change (its revocation, at once) and what differs by run (the run's project) the
    insert checks in the same statement."""

    LIMIT = 10_000  # tokens are few (jobs and people); forgotten all at once past this

    def __init__(self) -> None:
        self._known: dict[str, Principal] = {}

    def get(self, secret_hash: str) -> Principal | None:
        return self._known.get(secret_hash)

    def remember(self, secret_hash: str, principal: Principal) -> None:
        if len(self._known) >= self.LIMIT:
            self._known.clear()
        self._known[secret_hash] = principal


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
