"""Idempotency-Key support for aiohttp: a middleware factory and a per-handler opt-in.

.. code-block:: python

    app = web.Application(middlewares=[idempotency_middleware(manager, paths=())])

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response: ...

A handler whose work writes to PostgreSQL can record its response in its own transaction
(``docs/postgres.md``, "Transactional calls over HTTP")::

    @transactional_endpoint
    async def create_order(request: web.Request) -> web.Response:
        tx = request_transaction(request)
        async with pool.acquire() as connection, connection.transaction():
            response = await tx.run(connection, lambda: insert(connection, request))
        return response  # committed: only now is the record visible to duplicates

The behaviour is described in ``docs/http.md``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Literal, TypeVar, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._aiohttp_adapter import STATE_KEY, AiohttpAdapter
from idempotency_async.integrations._aiohttp_routing import DomainRouting
from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    DEFAULT_REPLAYED_HEADER,
    DEFAULT_REQUEST_TIMEOUT,
    CallerScope,
    HttpIdempotency,
    HttpSettings,
    HttpTransaction,
    PathPattern,
    RequestState,
    exchange,
    host_route,
)
from idempotency_async.manager import Manager
from idempotency_async.options import Wait

__all__ = [
    "HttpTransaction",
    "RequestState",
    "idempotency_middleware",
    "idempotent_endpoint",
    "request_state",
    "request_transaction",
    "transactional_endpoint",
]

_H = TypeVar("_H", bound=Handler)


_MARKED: weakref.WeakSet[Handler] = weakref.WeakSet()
_TRANSACTIONAL: weakref.WeakSet[Handler] = weakref.WeakSet()


def request_state(request: web.Request) -> RequestState | None:
    """The middleware's state of this request (the key is ``.key``); None if it did not see it."""
    return request.get(STATE_KEY)


def idempotent_endpoint(handler: _H) -> _H:
    """Opt a handler in to Idempotency-Key handling, whatever its method or path.

    The response is stored only when the handler *returns* it: a raised
    ``web.HTTPException`` (or any exception) releases the key and is not stored.  A
    request reaching the handler without :func:`idempotency_middleware` on the
    application raises :class:`~idempotency_async.errors.ConfigError` (a 500) before the
    handler runs.
    """

    @functools.wraps(handler)
    async def endpoint(request: web.Request) -> web.StreamResponse:
        state = request_state(request)
        if state is None:
            # Without the middleware every duplicate would run the handler again, silently.
            raise ConfigError(
                f"{handler.__qualname__} is an @idempotent_endpoint, but the application has "
                "no idempotency middleware: add it, e.g. web.Application(middlewares="
                "[idempotency_middleware(manager)])"
            )
        # The handler runs: a response it starts (prepare) or returns is its own.
        state.endpoint_ran = True
        try:
            return await handler(request)
        except BaseException:
            state.endpoint_ran = False
            raise

    _MARKED.add(endpoint)
    return cast(_H, endpoint)


def transactional_endpoint(handler: _H) -> _H:
    """Make a handler transactional: it records its response in its own database
    transaction through :func:`request_transaction`, whatever its method or path.

    The middleware does not claim the key for it: it replays a committed response (or
    answers 409/422) without running the handler, and otherwise runs it.  The key is
    required (400 without it).  A request reaching the handler without
    :func:`idempotency_middleware` raises :class:`~idempotency_async.errors.ConfigError`.
    """

    @functools.wraps(handler)
    async def endpoint(request: web.Request) -> web.StreamResponse:
        state = request_state(request)
        request_transaction(request)  # the middleware ran: else a ConfigError (a 500)
        assert state is not None
        # A response the handler returns is its own: one returned before its transaction
        # ran is answered with a 500 (see docs/http.md); one it raises goes out as it is.
        state.endpoint_ran = True
        try:
            return await handler(request)
        except BaseException:
            state.endpoint_ran = False
            raise

    _MARKED.add(endpoint)
    _TRANSACTIONAL.add(endpoint)
    return cast(_H, endpoint)


def request_transaction(request: web.Request) -> HttpTransaction[web.Response]:
    """The :class:`HttpTransaction` of a request to a :func:`transactional_endpoint`
    (``.key``, ``.scope``, ``.fingerprint``, and ``await .run(connection, work)``:
    ``work()`` writes through ``connection`` and returns the ``web.Response``)."""
    state = request_state(request)
    transaction = None if state is None else state.transaction
    if not isinstance(transaction, HttpTransaction):
        raise ConfigError(
            "request_transaction() needs the handler decorated with @transactional_endpoint "
            "and the application's idempotency middleware, e.g. web.Application("
            "middlewares=[idempotency_middleware(manager)])"
        )
    return transaction


def idempotency_middleware(
    manager: Manager,
    *,
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
) -> Middleware:
    """A middleware running each idempotent request once per ``Idempotency-Key``.

    Parameters as for :class:`~idempotency_async.integrations.starlette.IdempotencyMiddleware`;
    ``caller_scope`` receives the ``web.Request``.  Handlers decorated with
    :func:`idempotent_endpoint` are idempotent whatever ``methods`` and ``paths`` say.
    Put it last in ``middlewares`` so authentication middlewares reject requests first.
    The returned middleware has ``.manager`` (the manager it runs, derived from
    ``manager``) and ``.key_for(method, route, key, caller=None)`` (a request's key).
    """
    rules = HttpIdempotency(
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

    routing = DomainRouting()

    @web.middleware
    async def idempotency(request: web.Request, handler: Handler) -> web.StreamResponse:
        match_info = request.match_info
        resource = match_info.route.resource
        if match_info.http_exception is not None or resource is None:
            return await handler(request)
        marked = match_info.handler in _MARKED
        if not rules.settings.applies(request.method, request.path, marked=marked):
            return await handler(request)
        template = resource.canonical
        if routing.by_domain(match_info.apps):
            template = host_route(request.headers.get("host", ""), request.scheme, template)
        transactional = match_info.handler in _TRANSACTIONAL
        adapter = AiohttpAdapter(rules, request, handler, template, marked, transactional)
        return await exchange(rules, adapter)

    # The manager it runs (derived from ``manager``) and the key of a request, reachable
    # as with IdempotencyMiddleware: for force_release and record look-ups.
    idempotency.manager = rules.manager  # type: ignore[attr-defined]
    idempotency.key_for = rules.key_for  # type: ignore[attr-defined]
    return idempotency
