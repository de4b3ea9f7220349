"""The HTTP Idempotency-Key rules and response lifecycle, shared by every server adapter.

No framework imports here: the public adapters (:mod:`..starlette`, :mod:`..aiohttp`,
:mod:`..fastapi`) move bytes; this package decides.  One module per idea, imported
top-down::

    _settings     HttpSettings: the options, validated once and passed whole
    _responses    problem answers; the stored response format (written and read)
    _keys         Idempotency-Key parsing; the scope (method, route, caller, key)
    _fingerprint  the validation hash; the request body's size and nesting limits
    _rules        HttpIdempotency: the settings bound to the manager the middleware runs
    _markers      RequestState and the markers that opt a route in
    _answers      one table from the manager's errors to answers (409, 422, 503, 504)
    _gate         ResponseGate: the point of no return, as an explicit Phase
    _transaction  HttpTransaction: transactional routes record in the endpoint's transaction
    _exchange     exchange / run: one idempotent request, the one algorithm
    _asgi         the ASGI adapter (every response message type classified)

What a request is keyed and validated by::

    Idempotency-Key header ──> parse_key ──> scope {method, route, caller, key}   (the key)
    body (≤ max_body_bytes) ──> fingerprint {path, query, media type, body}       (validation)
"""

from idempotency_async.integrations._http._asgi import STATE_KEY, AsgiAdapter
from idempotency_async.integrations._http._exchange import exchange
from idempotency_async.integrations._http._fingerprint import too_large
from idempotency_async.integrations._http._gate import ResponseGate
from idempotency_async.integrations._http._keys import host_route, parse_key, request_scope
from idempotency_async.integrations._http._markers import (
    Marks,
    RequestState,
    register_marker,
    route_marks,
)
from idempotency_async.integrations._http._responses import HttpResponse, Rejection, content_length
from idempotency_async.integrations._http._rules import HttpIdempotency, http_manager
from idempotency_async.integrations._http._settings import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    DEFAULT_REPLAYED_HEADER,
    DEFAULT_REQUEST_TIMEOUT,
    STORED_HEADER,
    CallerScope,
    HttpSettings,
    PathPattern,
)
from idempotency_async.integrations._http._transaction import HttpTransaction, ResponseKind

# What the adapters (starlette, fastapi, aiohttp), the CLI's ``key --http`` and the fault
# simulator's HTTP door use; tests reach the modules themselves.
__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BODY_DEPTH",
    "DEFAULT_METHODS",
    "DEFAULT_REPLAYED_HEADER",
    "DEFAULT_REQUEST_TIMEOUT",
    "STATE_KEY",
    "STORED_HEADER",
    "AsgiAdapter",
    "CallerScope",
    "HttpIdempotency",
    "HttpResponse",
    "HttpSettings",
    "HttpTransaction",
    "Marks",
    "PathPattern",
    "Rejection",
    "RequestState",
    "ResponseGate",
    "ResponseKind",
    "content_length",
    "exchange",
    "host_route",
    "http_manager",
    "parse_key",
    "register_marker",
    "request_scope",
    "route_marks",
    "too_large",
]
