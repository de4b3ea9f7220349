"""What the test kit calls: the user's handler, built on the kit's store.

A target builds the handler from a store (so the kit can put its fault-injecting, logging
store under it) and sends one payload through it.  Three kinds here: an async function
(usually made with ``idempotent_function`` or calling ``Manager.execute``), an AWS Lambda
handler (invoked with a context that gives it its time), and an ASGI app's route, called
in process (no server, no HTTP client library: the ASGI messages themselves).  The
aiohttp door (``_kit_aiohttp``) and the SQS batch door (``_kit_batch``) have modules of
their own.  A target whose handler works in tasks of its own sets ``child_tasks`` (read
with ``getattr``: optional) so their awaits are crash points too (``_kit_steps``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from idempotency_async.stores.base import Store

__all__ = [
    "AsgiRoute",
    "FunctionHandler",
    "HttpAnswer",
    "LambdaContext",
    "LambdaHandler",
    "Sender",
    "Target",
    "callable_name",
]

Sender = Callable[[Any, str], Awaitable[Any]]
"""Sends one payload (with the scenario's request key, for HTTP) and returns its answer."""

Message = MutableMapping[str, Any]


class Target(Protocol):
    """A handler the kit can build on a store and call."""

    def build(self, store: Store) -> Sender: ...

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        """The idempotency key a call with ``payload`` uses (None: unknown)."""
        ...

    def expression(self) -> str:
        """Python text that rebuilds this target (for reproducers)."""
        ...


def callable_name(obj: object) -> str:
    """``module.qualname`` of a user's build function, for reproducers."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return "<your build function>"
    return f"{module}.{qualname}"


@dataclass(frozen=True, slots=True)
class FunctionHandler:
    """An async function of one payload, built on a store by ``build``."""

    build_handler: Callable[[Store], Callable[[Any], Awaitable[Any]]]

    def build(self, store: Store) -> Sender:
        handler = self.build_handler(store)

        async def send(payload: Any, request_key: str) -> Any:
            return await handler(payload)

        send.handler = handler  # type: ignore[attr-defined]
        return send

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        manager = getattr(getattr(sender, "handler", None), "manager", None)
        key_for = getattr(manager, "key_for", None)
        if key_for is None:
            return None
        try:
            key = key_for(payload)
        except Exception:
            return None
        return key if isinstance(key, str) else None

    def expression(self) -> str:
        return f"function_handler({callable_name(self.build_handler)})"


class LambdaContext:
    """What an invocation reads from its Lambda context: the time it has left."""

    function_name = "idempotency-kit"
    aws_request_id = "kit"

    def __init__(self, timeout: float) -> None:
        self._end = asyncio.get_running_loop().time() + timeout

    def get_remaining_time_in_millis(self) -> int:
        left = self._end - asyncio.get_running_loop().time()
        return max(0, int(left * 1000))


@dataclass(frozen=True, slots=True)
class LambdaHandler:
    """An ``async def handler(event, context)`` built on a store by ``build``; each payload
    is an event, invoked with a context giving it ``timeout`` seconds."""

    build_handler: Callable[[Store], Callable[[Any, Any], Awaitable[Any]]]
    timeout: float = 30.0

    def build(self, store: Store) -> Sender:
        handler = self.build_handler(store)

        async def send(payload: Any, request_key: str) -> Any:
            return await handler(payload, LambdaContext(self.timeout))

        return send

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        return None

    def expression(self) -> str:
        extra = f", timeout={self.timeout!r}" if self.timeout != 30.0 else ""
        return f"lambda_handler({callable_name(self.build_handler)}{extra})"


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A response as its client saw it: the status, and the body (JSON decoded when it is)."""

    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


@dataclass(frozen=True, slots=True)
class AsgiRoute:
    """A route of an ASGI app built on a store by ``build``; each payload is its JSON body,
    sent with ``key_header`` carrying the scenario's request key."""

    build_app: Callable[[Store], Any]
    path: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    key_header: str = "Idempotency-Key"

    def build(self, store: Store) -> Sender:
        app = self.build_app(store)

        async def send(payload: Any, request_key: str) -> HttpAnswer:
            return await _request(app, self, payload, request_key)

        return send

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        return request_key

    def expression(self) -> str:
        extra = f", method={self.method!r}" if self.method != "POST" else ""
        if self.headers:
            extra += f", headers={self.headers!r}"
        if self.key_header != "Idempotency-Key":
            extra += f", key_header={self.key_header!r}"
        return f"asgi_route({callable_name(self.build_app)}, {self.path!r}{extra})"


async def _request(app: Any, route: AsgiRoute, payload: Any, request_key: str) -> HttpAnswer:
    body = json.dumps(payload).encode()
    headers = [
        (route.key_header.lower().encode(), request_key.encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((name.lower().encode(), value.encode()) for name, value in route.headers),
    ]
    path, _, query = route.path.partition("?")
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": route.method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    received: list[Message] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The client stays connected until the response is complete: nothing else comes.
        await asyncio.Future()
        return {"type": "http.disconnect"}  # pragma: no cover - never reached

    async def send(message: Message) -> None:
        received.append(message)

    await app(scope, receive, send)
    return _answer(received)


def _answer(messages: list[Message]) -> HttpAnswer:
    status, chunks = 500, []
    headers: tuple[tuple[str, str], ...] = ()
    for message in messages:
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = tuple(
                (bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
                for name, value in message.get("headers", ())
            )
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
    raw = b"".join(chunks)
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = raw
    return HttpAnswer(status, body, headers)
