"""Idempotency-Key support for Starlette (and FastAPI) as a pure ASGI middleware.

.. code-block:: python

    app = Starlette(routes=..., middleware=[
        Middleware(IdempotencyMiddleware, manager=Manager(MemoryStore()),
                   caller_scope=lambda request: request.headers.get("x-api-key")),
    ])

The behaviour is described in ``docs/http.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Host, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    DEFAULT_REPLAYED_HEADER,
    DEFAULT_REQUEST_TIMEOUT,
    STATE_KEY,
    STORED_HEADER,
    AsgiAdapter,
    CallerScope,
    HttpIdempotency,
    HttpResponse,
    HttpSettings,
    HttpTransaction,
    Marks,
    PathPattern,
    RequestState,
    exchange,
    host_route,
    route_marks,
)
from idempotency_async.manager import Manager
from idempotency_async.options import Wait

__all__ = ["HttpTransaction", "IdempotencyMiddleware", "RequestState", "request_state"]

_NO_BODY = frozenset({204, 304})
_UNMARKED = Marks(False, False, False)


def request_state(scope: Scope) -> RequestState | None:
    """The middleware's state of this request; None when the middleware did not see it."""
    state = scope.get(STATE_KEY)
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
    :param wait: ``Wait(timeout=...)``: a duplicate that finds the key in progress waits
        (at most ``timeout`` seconds, then 409) for the first request to finish and replays
        its response; ``False``: answer 409 at once; None: as the manager's ``Options.wait``.
    :param replayed_header: the header (value ``true``) that marks a replayed response,
        and a duplicate's "not stored" answer (default ``Idempotent-Replayed``).
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
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_body_depth: int = DEFAULT_MAX_BODY_DEPTH,
        max_response_bytes: int | None = None,
        store_server_errors: bool = False,
        replay_headers: Iterable[str] = (),
        wait: Wait | Literal[False] | None = None,
        replayed_header: str = DEFAULT_REPLAYED_HEADER,
    ) -> None:
        self.app = app
        self.rules = HttpIdempotency(
            manager,
            HttpSettings(
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
                replayed_header=replayed_header,
            ),
        )
        self._marked: dict[int, tuple[BaseRoute, Marks]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _route_template(scope, self.app)
        if route is None:  # no route matches: the app answers 404/405 itself
            await self.app(scope, receive, send)
            return
        template, matched = route
        marked, key_required, transactional = _UNMARKED if matched is None else self._marks(matched)
        settings = self.rules.settings
        if not settings.applies(scope["method"], scope["path"], marked=marked):
            await self.app(scope, receive, send)
            return
        adapter = AsgiAdapter(
            self.app,
            self.rules,
            scope,
            receive,
            send,
            template=template,
            marked=marked,
            key_required=key_required or settings.required,
            request=Request(scope),
            transactional=transactional,
            kind=_RESPONSES,
        )
        await exchange(self.rules, adapter)

    @property
    def manager(self) -> Manager:
        """The manager the middleware runs (derived from the one it was given, see
        ``docs/http.md``): ``force_release`` a key of this middleware through it."""
        return self.rules.manager

    def key_for(self, method: str, route: str, key: str, caller: str | None = None) -> str:
        """The idempotency key a request stores under (``route``: the route's template,
        e.g. ``/orders/{order_id}``; ``caller``: what ``caller_scope`` returned)."""
        return self.rules.key_for(method, route, key, caller)

    def _marks(self, route: BaseRoute) -> Marks:
        """Whether a route is opted in, whether its marker requires the key, and whether
        it is transactional."""
        # Keyed by identity; the route is kept beside its marks so that an id reused by
        # another object (FastAPI rebuilds an included router's routes when they change)
        # is never taken for it.
        known = self._marked.get(id(route))
        if known is None or known[0] is not route:
            known = (route, route_marks(getattr(route, "dependant", None)))
            self._marked[id(route)] = known
        return known[1]


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
        contexts = getattr(route, "effective_route_contexts", None)
        if callable(contexts):
            # FastAPI 0.16x includes a router as one route that matches through its routes
            # as included (full path, the include's dependencies): match those instead.
            found = _match(list(contexts()), scope, prefix, by_host)
            if found is not None:
                return found
            continue
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


class Responses:
    """Starlette responses, as a transactional endpoint returns them (see
    :class:`HttpTransaction`); FastAPI's routes refine :meth:`respond`."""

    async def respond(self, value: object) -> Response:
        return value  # type: ignore[return-value]  # checked by parts()

    def parts(self, response: Response) -> tuple[int, list[tuple[str, str]], bytes]:
        body = getattr(response, "body", None) if isinstance(response, Response) else None
        if not isinstance(body, bytes | memoryview):
            raise ConfigError(
                "the work of a transactional call must return a Starlette Response with its "
                f"whole body (e.g. JSONResponse), got {type(response).__name__}: a streamed "
                "or file body cannot be recorded in the transaction"
            )
        headers = [
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in response.raw_headers
        ]
        return response.status_code, headers, bytes(body)

    def build(self, response: HttpResponse) -> Response:
        replayed = Response(response.body, status_code=response.status)
        headers = [
            (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
        ]
        if response.status not in _NO_BODY:
            headers.append((b"content-length", str(len(response.body)).encode()))
        replayed.raw_headers = headers
        return replayed

    def mark_not_stored(self, response: Response) -> None:
        response.headers[STORED_HEADER] = "false"


_RESPONSES = Responses()
