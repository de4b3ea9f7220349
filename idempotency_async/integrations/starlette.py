"""Idempotency-Key support for Starlette (and FastAPI) as a pure ASGI middleware.

.. code-block:: python

    app = Starlette(routes=..., middleware=[
        Middleware(IdempotencyMiddleware, manager=Manager(MemoryStore()),
                   caller_scope=lambda request: request.headers.get("x-api-key")),
    ])

The rules are those of :mod:`idempotency_async.integrations._http`; see ``docs/http.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from starlette.requests import Request
from starlette.routing import BaseRoute, Host, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from idempotency_async.integrations._exchange import ResponseGate, exchange
from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    STORED_HEADER,
    CallerScope,
    HttpIdempotency,
    HttpResponse,
    PathPattern,
    Rejection,
    RequestState,
    host_route,
)
from idempotency_async.manager import Manager

__all__ = ["IdempotencyMiddleware", "RequestState", "request_state"]

_STATE_KEY: Final = "idempotency_async"
# Response messages whose body bypasses the middleware (the server reads a file).
_BYPASSING: Final = frozenset({"http.response.pathsend", "http.response.zerocopysend"})
# Dependencies that opt a FastAPI route in, each with whether it requires the key (the
# fastapi module registers its own).
_ROUTE_MARKERS: dict[Callable[..., Any], bool] = {}


def request_state(scope: Scope) -> RequestState | None:
    """The middleware's state of this request; None when the middleware did not see it."""
    state = scope.get(_STATE_KEY)
    return state if isinstance(state, RequestState) else None


class IdempotencyMiddleware:
    """Runs each idempotent request once per ``Idempotency-Key`` and replays its response.

    A request is idempotent when its route carries
    :func:`~idempotency_async.integrations.fastapi.idempotency_dependency` (any method), or
    its method is in ``methods`` and its path matches ``paths`` (glob strings matched with
    :func:`fnmatch.fnmatchcase`, or compiled regular expressions; None: every path of a
    route the app has).  ``paths=()`` handles only the opted-in FastAPI routes.

    :param manager: supplies the store and options (prefix, expiry, hash, cache); the
        middleware runs its own manager over them with HTTP key and validation selections.
    :param required: answer 400 when an idempotent request carries no key.
    :param caller_scope: ``callable(request) -> str | None`` (sync or async) naming the
        caller (tenant, principal); without it the middleware is single-tenant.
    :param request_timeout: the deadline of each idempotent request, and so the longest
        a crashed or cancelled request blocks its key.
    :param max_body_bytes: larger request bodies are answered with 413 (reading stops
        at the limit).
    :param max_body_depth: JSON request bodies nesting arrays and objects deeper are
        answered with 400 (at most 512).
    :param max_response_bytes: larger response bodies are delivered but not stored
        (default: what fits in the store).
    :param store_server_errors: store and replay 5xx responses instead of releasing the key.
    :param replay_headers: response headers replayed besides content-type, location,
        etag, cache-control and link (``Set-Cookie`` never is).
    :param wait: whether a duplicate that finds the key in progress waits for the first
        request to finish and replays its response (False: answer 409 at once); None:
        as the manager's ``Options.wait``.
    :param wait_timeout: the longest such a wait lasts, in seconds (then 409); None: as
        the manager's ``Options.wait_timeout``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        manager: Manager,
        methods: Iterable[str] = DEFAULT_METHODS,
        paths: Iterable[PathPattern] | None = None,
        required: bool = False,
        caller_scope: CallerScope | None = None,
        request_timeout: float = 30.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_body_depth: int = DEFAULT_MAX_BODY_DEPTH,
        max_response_bytes: int | None = None,
        store_server_errors: bool = False,
        replay_headers: Iterable[str] = (),
        wait: bool | None = None,
        wait_timeout: float | None = None,
    ) -> None:
        self.app = app
        self.rules = HttpIdempotency(
            manager,
            methods=methods,
            paths=paths,
            required=required,
            caller_scope=caller_scope,
            request_timeout=request_timeout,
            max_body_bytes=max_body_bytes,
            max_body_depth=max_body_depth,
            max_response_bytes=max_response_bytes,
            store_server_errors=store_server_errors,
            replay_headers=replay_headers,
            wait=wait,
            wait_timeout=wait_timeout,
        )
        self._marked: dict[int, tuple[bool, bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _route_template(scope, self.app)
        if route is None:  # no route matches: the app answers 404/405 itself
            await self.app(scope, receive, send)
            return
        template, matched = route
        marked, key_required = (False, False) if matched is None else self._marks(matched)
        if not self.rules.applies(scope["method"], scope["path"], marked=marked):
            await self.app(scope, receive, send)
            return
        required = key_required or self.rules.settings.required
        await exchange(self.rules, _Asgi(self, scope, receive, send, template, marked, required))

    @property
    def manager(self) -> Manager:
        """The manager the middleware runs (derived from the one it was given, see
        ``docs/http.md``): ``force_release`` a key of this middleware through it."""
        return self.rules.manager

    def key_for(self, method: str, route: str, key: str, caller: str | None = None) -> str:
        """The idempotency key a request stores under (``route``: the route's template,
        e.g. ``/orders/{order_id}``; ``caller``: what ``caller_scope`` returned)."""
        return self.rules.key_for(method, route, key, caller)

    def _marks(self, route: BaseRoute) -> tuple[bool, bool]:
        """Whether a route is opted in, and whether its marker requires the key."""
        known = self._marked.get(id(route))
        if known is None:
            known = _route_marks(getattr(route, "dependant", None))
            self._marked[id(route)] = known
        return known


class _Asgi:
    """The ASGI side of one idempotent request (see :mod:`._exchange` for the algorithm)."""

    def __init__(
        self,
        middleware: IdempotencyMiddleware,
        scope: Scope,
        receive: Receive,
        send: Send,
        template: str,
        marked: bool,
        key_required: bool,
    ) -> None:
        self.app = middleware.app
        self.rules = middleware.rules
        self.scope = scope
        self.receive = receive
        self.send = send
        self.template = template
        self.marked = marked
        self.key_required = key_required
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query = scope.get("query_string", b"").decode("latin-1")
        self.request = Request(scope)
        self.gate: ResponseGate | None = None
        # The head is held until the first body message shows whether the whole body is in
        # hand (a plain response) or more follows (a stream).
        self.head: Message | None = None
        self.gone = False

    def headers(self, name: str) -> list[str]:
        return self.request.headers.getlist(name)

    def install(self, state: RequestState) -> None:
        self.scope[_STATE_KEY] = state

    async def read_body(self, limit: int) -> bytes | None:
        chunks = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return None
            chunks += message.get("body", b"")
            if len(chunks) > limit:
                raise Rejection(self.rules.too_large())
            if not message.get("more_body", False):
                return bytes(chunks)

    async def passthrough(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    def live(self) -> None:
        return None

    async def answer(self, response: HttpResponse) -> None:
        await _send_response(self.send, response)

    async def run_endpoint(self, body: bytes, gate: ResponseGate) -> None:
        self.gate = gate
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            message = await self.receive()
            if message["type"] == "http.disconnect":
                gate.client_gone()  # Starlette then stops the stream: say why it ended
            return message

        await self.app(self.scope, receive, self._tee)
        if self.head is not None:
            # A head without a body message: the response never ended (a stream cut short
            # before its first chunk, e.g. by a disconnect on servers before ASGI 2.4).  It
            # is past the point of no return, and not complete: recorded as not stored.
            await self._start(None)

    async def _tee(self, message: Message) -> None:
        gate = self.gate
        assert gate is not None
        kind = message["type"]
        if kind == "http.response.start":
            self.head = message
            return
        if kind == "http.response.body":
            more = message.get("more_body", False)
            chunk = message.get("body", b"")
            if self.head is not None:
                await self._start(None if more else chunk)
                if not more:
                    return  # the plain body went out with the head
            gate.write(chunk)
            if not more:
                await gate.end()
        elif kind in _BYPASSING:
            # The body is sent by the server from a file: it never passes through here.
            if self.head is not None:
                await self._start(None)
            gate.untrackable()
        elif self.head is not None:
            # Anything else after the head (trailers, extensions): the head goes first, as
            # a stream, and the capture goes on.
            await self._start(None)
        # Else a message before the head (an early hint, an extension's informational
        # message): forwarded as it is; it says nothing about the response's body.
        await self._forward(message)

    async def _start(self, body: bytes | None) -> None:
        """The point of no return: the gate records, then the head goes out."""
        gate, head = self.gate, self.head
        assert gate is not None and head is not None
        self.head = None
        raw = list(head.get("headers", []))
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw]
        if await gate.start(head["status"], headers, body):
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


async def _send_response(send: Send, response: HttpResponse) -> None:
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
    ]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _route_template(scope: Scope, app: ASGIApp) -> tuple[str, BaseRoute | None] | None:
    """The matched route's path template, or the raw path when the app has no routes.

    Routing has not run yet in a middleware, so this matches the app's routes the way
    Starlette's router does (first full match, into mounts and hosts).  Under a
    ``Host(...)`` route the template starts with the host the router matched (see
    :func:`host_route`): one pattern serves many tenants.  None: no route matches.
    """
    # Inside the app's middleware stack the app is in the scope; wrapping the app directly
    # (IdempotencyMiddleware(app, ...)) it is the wrapped one.
    routes = getattr(scope.get("app", app), "routes", None)
    if not isinstance(routes, Sequence):
        return scope["path"], None
    found = _match(routes, scope, "")
    if found is None:
        return None
    template, route, by_host = found
    if by_host:
        host = Request(scope).headers.get("host", "")
        template = host_route(host, scope.get("scheme", "http"), template)
    return template, route


def _match(
    routes: Sequence[BaseRoute], scope: Scope, prefix: str, by_host: bool = False
) -> tuple[str, BaseRoute | None, bool] | None:
    for route in routes:
        match, child = route.matches(scope)
        if match is not Match.FULL:
            continue
        by_host = by_host or isinstance(route, Host)
        path = str(getattr(route, "path_format", getattr(route, "path", "")))
        if isinstance(route, Route):
            return prefix + path, route, by_host
        inner = getattr(route, "routes", None)
        if isinstance(inner, Sequence) and inner:
            return _match(inner, {**scope, **child}, prefix + path, by_host)
        return prefix + path, route, by_host
    return None


def _route_marks(dependant: Any) -> tuple[bool, bool]:
    """(opted in, key required) from the markers among a route's dependencies."""
    marked = required = False
    stack = [dependant]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        call = getattr(node, "call", None)
        for marker, requires_key in _ROUTE_MARKERS.items():
            if call is marker:
                marked = True
                required = required or requires_key
        stack.extend(getattr(node, "dependencies", ()))
    return marked, required
