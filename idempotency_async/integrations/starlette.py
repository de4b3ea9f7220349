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
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_METHODS,
    KEY_HEADER,
    STORED_HEADER,
    CallerScope,
    Capture,
    HttpIdempotency,
    HttpResponse,
    PathPattern,
    Rejection,
    RequestState,
    parse_key,
)
from idempotency_async.manager import Manager

__all__ = ["IdempotencyMiddleware", "RequestState", "request_state"]

_STATE_KEY: Final = "idempotency_async"
# Dependencies that opt a FastAPI route in (the fastapi module registers its own).
_ROUTE_MARKERS: set[Callable[..., Any]] = set()


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
    :param max_body_bytes: larger request bodies are answered with 413.
    :param max_response_bytes: larger response bodies are delivered but not stored
        (default: what fits in the store).
    :param store_server_errors: store and replay 5xx responses instead of releasing the key.
    :param replay_headers: response headers replayed besides content-type, location,
        etag, cache-control and link (``Set-Cookie`` never is).
    :param wait: seconds a duplicate waits for the first request to finish and replays
        its response (0: answer 409 at once; None: as the manager's options say).
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
        max_response_bytes: int | None = None,
        store_server_errors: bool = False,
        replay_headers: Iterable[str] = (),
        wait: float | None = None,
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
            max_response_bytes=max_response_bytes,
            store_server_errors=store_server_errors,
            replay_headers=replay_headers,
            wait=wait,
        )
        self._marked: dict[int, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _route_template(scope)
        if route is None:  # no route matches: the app answers 404/405 itself
            await self.app(scope, receive, send)
            return
        template, matched = route
        marked = matched is not None and self._is_marked(matched)
        if not self.rules.applies(scope["method"], scope["path"], marked=marked):
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send, template, marked).run()

    def _is_marked(self, route: BaseRoute) -> bool:
        known = self._marked.get(id(route))
        if known is None:
            known = _depends_on_marker(getattr(route, "dependant", None))
            self._marked[id(route)] = known
        return known


class _Exchange:
    """One idempotent request: its body, its capture, and what to send."""

    def __init__(
        self,
        middleware: IdempotencyMiddleware,
        scope: Scope,
        receive: Receive,
        send: Send,
        template: str,
        marked: bool,
    ) -> None:
        self.app = middleware.app
        self.rules = middleware.rules
        self.scope = scope
        self.receive = receive
        self.send = send
        self.template = template
        self.marked = marked
        self.capture = Capture(self.rules.settings.max_response_bytes)
        self.client_gone = False
        # The last body message is held back until the record is completed, so a client
        # that retries as soon as it has the whole response gets the replay, not a 409.
        self.final: Message | None = None

    async def run(self) -> None:
        headers = Request(self.scope).headers
        try:
            key = parse_key(headers.getlist(KEY_HEADER), required=self.rules.settings.required)
            self.scope[_STATE_KEY] = RequestState(key)
            if key is None:
                await self.app(self.scope, self.receive, self.send)
                return
            self.rules.check_length(headers.get("content-length"))
            body = await self._read_body()
            if body is None:
                return  # the client went away before sending its body
            payload = self.rules.payload(
                method=self.scope["method"],
                route=self.template,
                caller=await self.rules.caller(Request(self.scope)),
                key=key,
                path=self.scope["path"],
                query=self.scope.get("query_string", b"").decode("latin-1"),
                content_type=headers.get("content-type"),
                body=body,
            )
            self.capture.endpoint_ran = not self.marked
            try:
                replay = await self.rules.handle(
                    payload, lambda: self._run_app(body), self.capture
                )
            finally:
                await self._send_final()
        except Rejection as rejection:
            replay = rejection.response
        if replay is not None:
            await _send_response(self.send, replay)

    async def _send_final(self) -> None:
        final, self.final = self.final, None
        if final is not None:
            await self._forward(final)

    async def _read_body(self) -> bytes | None:
        limit = self.rules.settings.max_body_bytes
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

    async def _run_app(self, body: bytes) -> None:
        state = request_state(self.scope)
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await self.receive()

        await self.app(self.scope, receive, self._tee)
        if self.marked and state is not None:
            self.capture.endpoint_ran = state.endpoint_returned

    async def _tee(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            raw = list(message.get("headers", []))
            headers = [
                (name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw
            ]
            if self.capture.start(message["status"], headers):
                message = {**message, "headers": [*raw, (STORED_HEADER.encode(), b"false")]}
        elif kind == "http.response.body":
            more = message.get("more_body", False)
            self.capture.write(message.get("body", b""), more=more)
            if not more:
                self.final = message
                return
        else:
            self.capture.untrackable()
        await self._forward(message)

    async def _forward(self, message: Message) -> None:
        if self.client_gone:
            return
        try:
            await self.send(message)
        except OSError:
            # The client went away: keep consuming the endpoint's response so the record
            # completes and the client's retry gets the replay.
            self.client_gone = True


async def _send_response(send: Send, response: HttpResponse) -> None:
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
    ]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _route_template(scope: Scope) -> tuple[str, BaseRoute | None] | None:
    """The matched route's path template, or the raw path when the app has no routes.

    Routing has not run yet in a middleware, so this matches the app's routes the way
    Starlette's router does (first full match, into mounts).  None: no route matches.
    """
    routes = getattr(scope.get("app"), "routes", None)
    if not isinstance(routes, Sequence):
        return scope["path"], None
    return _match(routes, scope, "")


def _match(
    routes: Sequence[BaseRoute], scope: Scope, prefix: str
) -> tuple[str, BaseRoute | None] | None:
    for route in routes:
        match, child = route.matches(scope)
        if match is not Match.FULL:
            continue
        path = str(getattr(route, "path_format", getattr(route, "path", "")))
        if isinstance(route, Route):
            return prefix + path, route
        inner = getattr(route, "routes", None)
        if isinstance(inner, Sequence) and inner:
            return _match(inner, {**scope, **child}, prefix + path)
        return prefix + path, route
    return None


def _depends_on_marker(dependant: Any) -> bool:
    stack = [dependant]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        call = getattr(node, "call", None)
        if any(call is marker for marker in _ROUTE_MARKERS):
            return True
        stack.extend(getattr(node, "dependencies", ()))
    return False
