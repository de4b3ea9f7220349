"""The ASGI side of one idempotent request: the adapter the Starlette middleware runs.

It moves ASGI messages; the decisions are the exchange's and the gate's.  Every response
message type the ASGI specification and its extensions define is classified below, and
a type it does not define is a decision too (:attr:`_Kind.UNKNOWN`), never a default.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import parse_qsl

from idempotency_async.integrations._http._fingerprint import too_large
from idempotency_async.integrations._http._gate import ResponseGate
from idempotency_async.integrations._http._markers import RequestState
from idempotency_async.integrations._http._responses import NO_BODY, HttpResponse, Rejection
from idempotency_async.integrations._http._rules import HttpIdempotency
from idempotency_async.integrations._http._settings import STORED_HEADER

__all__ = ["STATE_KEY", "AsgiAdapter", "send_response"]

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_KEY: Final = "idempotency_async"
"""Where the request's :class:`RequestState` is kept in the ASGI scope."""


class _Kind(enum.Enum):
    """What a response message sent by the application means to the capture."""

    HEAD = "the response head: held until the first body message shows its kind"
    BODY = "a body chunk: the first one decides plain (whole body) or stream"
    FILE = "a body the server reads from a file: it bypasses the capture"
    INFORMATIONAL = "a message that may precede the head: forwarded in order"
    TRAILERS = "a message after the body: forwarded in order"
    UNKNOWN = "a type this middleware does not know: forwarded in order"


_KINDS: Final = {
    "http.response.start": _Kind.HEAD,
    "http.response.body": _Kind.BODY,
    "http.response.pathsend": _Kind.FILE,
    "http.response.zerocopysend": _Kind.FILE,
    "http.response.early_hint": _Kind.INFORMATIONAL,
    "http.response.debug": _Kind.INFORMATIONAL,
    "http.response.push": _Kind.INFORMATIONAL,
    "http.response.trailers": _Kind.TRAILERS,
}


class AsgiAdapter:
    """One idempotent ASGI request (see :mod:`._exchange` for the algorithm)."""

    def __init__(
        self,
        app: App,
        rules: HttpIdempotency,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        template: str,
        marked: bool,
        key_required: bool,
        request: Any,
        transactional: bool = False,
        kind: Any = None,
    ) -> None:
        self.app = app
        self.rules = rules
        self.scope = scope
        self.receive = receive
        self.send = send
        self.template = template
        self.marked = marked
        self.transactional = transactional
        self.kind = kind
        self.head_sent = False
        self.key_required = key_required
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        # Decoded as Starlette's ``request.query_params`` decodes it.
        self.query = parse_qsl(
            scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
        )
        self.request = request
        # A list, as Starlette keeps it (a server may send any iterable, read more than once).
        self.raw_headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        scope["headers"] = self.raw_headers
        self.gate: ResponseGate | None = None
        # The head is held until the first body message shows whether the whole body is in
        # hand (a plain response) or more follows (a stream).
        self.head: Message | None = None
        self.gone = False

    def headers(self, name: str) -> list[str]:
        # As Starlette's ``Headers.getlist``: ASGI servers send lower-cased names.
        wanted = name.lower().encode("latin-1")
        return [value.decode("latin-1") for key, value in self.raw_headers if key == wanted]

    def install(self, state: RequestState) -> None:
        self.scope[STATE_KEY] = state

    async def read_body(self, limit: int) -> bytes | None:
        chunks = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return None
            chunks += message.get("body", b"")
            if len(chunks) > limit:
                raise Rejection(too_large(self.rules.settings.max_body_bytes))
            if not message.get("more_body", False):
                return bytes(chunks)

    async def passthrough(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    def live(self) -> None:
        return None

    async def answer(self, response: HttpResponse) -> None:
        await send_response(self.send, response)

    def _replaying(self, body: bytes, gate: ResponseGate | None) -> Receive:
        """A ``receive`` handing the endpoint the body already read, then the client's
        later messages."""
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            message = await self.receive()
            if message["type"] == "http.disconnect" and gate is not None:
                gate.client_gone()  # Starlette then stops the stream: say why it ended
            return message

        return receive

    async def forward(
        self, body: bytes, vet: Callable[[int], HttpResponse | None] | None = None
    ) -> None:
        replaced = False

        async def send(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return  # the rest of a response the middleware answered instead
            if message["type"] == "http.response.start":
                instead = None if vet is None else vet(message["status"])
                if instead is not None:
                    replaced = True
                    await send_response(self.send, instead)
                    self.head_sent = True
                    return
                self.head_sent = True
            await self.send(message)

        await self.app(self.scope, self._replaying(body, None), send)

    async def run_endpoint(self, body: bytes, gate: ResponseGate) -> None:
        self.gate = gate
        await self.app(self.scope, self._replaying(body, gate), self._tee)
        if self.head is not None:
            # A head without a body message: the response never ended (a stream cut short
            # before its first chunk, e.g. by a disconnect on servers before ASGI 2.4).  It
            # is past the point of no return, and not complete: recorded as not stored.
            await self._start(None)

    async def _tee(self, message: Message) -> None:
        gate = self.gate
        assert gate is not None
        kind = _KINDS.get(message["type"], _Kind.UNKNOWN)
        if kind is _Kind.HEAD:
            self.head = message
            return
        if kind is _Kind.BODY:
            more = message.get("more_body", False)
            chunk = message.get("body", b"")
            if self.head is not None:
                await self._start(None if more else chunk)
                if not more:
                    return  # the plain body went out with the head
            gate.write(chunk)
            if not more:
                await gate.end()
        elif kind is _Kind.FILE:
            # The body is sent by the server from a file: it never passes through here.
            if self.head is not None:
                await self._start(None, from_file=True)
            gate.untrackable()
            if not message.get("more_body", False):
                await gate.end()  # pathsend ends the response: its reason is the file's
        elif self.head is not None:
            # INFORMATIONAL, TRAILERS or UNKNOWN once a head is held: the head goes first,
            # as a stream (its body is not in hand), and the capture goes on.
            await self._start(None)
        # Else INFORMATIONAL, TRAILERS or UNKNOWN with no head held (an early hint, or a
        # message after the body): forwarded as it is; it says nothing about the body.
        await self._forward(message)

    async def _start(self, body: bytes | None, *, from_file: bool = False) -> None:
        """The point of no return: the gate records, then the head goes out.  ``from_file``:
        the body follows from a file the server sends (the head says it is not stored)."""
        gate, head = self.gate, self.head
        assert gate is not None and head is not None
        self.head = None
        raw = list(head.get("headers", []))
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw]
        not_stored = await gate.start(head["status"], headers, body)
        if from_file:
            not_stored = gate.untrackable() or not_stored
        if not_stored:
            head = {**head, "headers": [*raw, (STORED_HEADER.encode(), b"false")]}
        await self._forward(head)
        if body is not None:
            await self._forward({"type": "http.response.body", "body": body, "more_body": False})

    async def _forward(self, message: Message) -> None:
        if self.gone:
            return
        try:
            await self.send(message)
        except OSError:
            # The client went away: keep consuming the endpoint's response so the record
            # gets the whole body when the endpoint produces it.
            self.gone = True
            if self.gate is not None:
                self.gate.client_gone()


async def send_response(send: Send, response: HttpResponse) -> None:
    """Send a complete response of the middleware's own (a replay or a problem)."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
    ]
    if response.status not in NO_BODY:
        headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
