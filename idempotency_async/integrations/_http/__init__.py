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
    _gate         ResponseGate: the point of no return, as an explicit Phase
    _answers      the answers to duplicates and store failures (409, 422, 503)
    _transaction  HttpTransaction: transactional routes record in the endpoint's transaction
    _exchange     exchange / run: one idempotent request, the one algorithm
    _asgi         the ASGI adapter (every response message type classified)

What a request is keyed and validated by::

    Idempotency-Key header ──> parse_key ──> scope {method, route, caller, key}   (the key)
    body (≤ max_body_bytes) ──> fingerprint {path, query, media type, body}       (validation)
"""

from idempotency_async.integrations._http._answers import retry_after
from idempotency_async.integrations._http._asgi import STATE_KEY, AsgiAdapter, send_response
from idempotency_async.integrations._http._exchange import (
    REPLAYED_ATTRIBUTE,
    Adapter,
    exchange,
    run,
)
from idempotency_async.integrations._http._fingerprint import check_length, fingerprint, too_large
from idempotency_async.integrations._http._gate import Phase, ResponseGate
from idempotency_async.integrations._http._keys import (
    KEY_HEADER,
    MAX_KEY_LENGTH,
    host_route,
    parse_key,
    request_scope,
)
from idempotency_async.integrations._http._markers import (
    Marks,
    RequestState,
    register_marker,
    route_marks,
)
from idempotency_async.integrations._http._responses import (
    HttpResponse,
    Rejection,
    content_length,
    not_available,
    problem,
    replay,
)
from idempotency_async.integrations._http._rules import HttpIdempotency, http_manager
from idempotency_async.integrations._http._settings import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    DEFAULT_REPLAY_HEADERS,
    DEFAULT_REQUEST_TIMEOUT,
    REPLAYED_HEADER,
    STORED_HEADER,
    CallerScope,
    HttpSettings,
    PathPattern,
)
from idempotency_async.integrations._http._transaction import HttpTransaction, ResponseKind

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BODY_DEPTH",
    "DEFAULT_METHODS",
    "DEFAULT_REPLAY_HEADERS",
    "DEFAULT_REQUEST_TIMEOUT",
    "KEY_HEADER",
    "MAX_KEY_LENGTH",
    "REPLAYED_ATTRIBUTE",
    "REPLAYED_HEADER",
    "STATE_KEY",
    "STORED_HEADER",
    "Adapter",
    "AsgiAdapter",
    "CallerScope",
    "HttpIdempotency",
    "HttpResponse",
    "HttpSettings",
    "HttpTransaction",
    "Marks",
    "PathPattern",
    "Phase",
    "Rejection",
    "RequestState",
    "ResponseKind",
    "ResponseGate",
    "check_length",
    "content_length",
    "exchange",
    "fingerprint",
    "host_route",
    "http_manager",
    "not_available",
    "parse_key",
    "problem",
    "register_marker",
    "replay",
    "request_scope",
    "retry_after",
    "route_marks",
    "run",
    "send_response",
    "too_large",
]
