"""Idempotent routes of Powertools' Event Handler, resolved with ``resolve_async``.

.. code-block:: python

    app = APIGatewayRestResolver()

    @app.post("/orders", middlewares=[idempotent_route(manager)])
    async def create_order() -> tuple[dict[str, str], int]: ...

    async def handler(event, context):
        return await app.resolve_async(event, context)

One request through the route's middleware::

    the event ──> key: the manager's event_key_jmespath (as Powertools' @idempotent)
              ──> Manager.execute_call(run the rest of the route's middlewares and the route)
        first call ──> the route's Response; stored as an API Gateway proxy response
                       (statusCode, headers, body, isBase64Encoded) unless it is a 5xx,
                       408, 409, 425 or 429, which releases the key
        duplicate  ──> that response again, marked ``Idempotent-Replayed: true`` (or the
                       ``replayed_header`` given); ``redaction``'s fields are not stored
        in progress ──> 409 (Retry-After) · other payload ──> 422 · no key ──> 400
        not stored ──> 409 · anything else propagates to the resolver's exception handlers

The behaviour is described in ``docs/lambda.md``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aws_lambda_powertools.event_handler.api_gateway import Response
from aws_lambda_powertools.shared.json_encoder import Encoder

from idempotency_async._call import Call
from idempotency_async._function_manager import function_manager
from idempotency_async._lease import check_duration
from idempotency_async._stored_redaction import Redaction, remove
from idempotency_async.errors import (
    AlreadyInProgressError,
    ConfigError,
    PayloadError,
    PayloadValidationError,
    ResponseNotStoredError,
)
from idempotency_async.integrations._http._redacting import NEVER_STORED, check_redaction
from idempotency_async.integrations._lambda.context import (
    ambient_invocation_deadline,
    invocation_deadline,
)
from idempotency_async.manager import Manager

__all__ = ["REDACTED_HEADER", "REPLAYED_HEADER", "idempotent_route"]

REPLAYED_HEADER: Final = "Idempotent-Replayed"
"""Added (value ``true``) to a replayed response, unless ``replayed_header`` names another."""

REDACTED_HEADER: Final = "Idempotency-Response-Redacted"
"""Stored (value ``true``) with a response whose declared fields were removed."""

_OWNED: Final = frozenset(
    {"set-cookie", "retry-after", "content-type", "idempotency-key", REDACTED_HEADER.lower()}
)
"""Header names ``replayed_header`` may not take: stripped, or sent for another purpose."""

_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (RFC 9110 token)."""

_NOT_STORED_STATUSES: Final = frozenset({408, 409, 425, 429})
"""Answers that say "not done, retry": released like server errors, never replayed."""

_PROBLEM: Final = "application/problem+json"

_ANSWERED: Final = (
    AlreadyInProgressError,
    PayloadError,
    PayloadValidationError,
    ResponseNotStoredError,
)
"""The manager's answers a duplicate (or an unkeyable request) gets instead of the route."""

Middleware = Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


def idempotent_route(
    manager: Manager,
    *,
    timeout: float | None = None,
    replayed_header: str = REPLAYED_HEADER,
    redaction: Redaction | None = None,
) -> Middleware:
    """A Powertools Event Handler middleware running its route once per key.

    Put it in a route's ``middlewares=[...]`` (or ``app.use``) of an API Gateway (REST or
    HTTP API) or ALB resolver whose handler calls ``await app.resolve_async(event,
    context)``; it is an ``async`` middleware, which the synchronous ``resolve`` cannot
    run.  The whole event is the payload: the manager's ``event_key_jmespath`` selects the
    key, as with Powertools' ``@idempotent`` on a handler.  Without an explicit
    ``key_prefix``, keys carry the route function's prefix — with
    ``Options(key_format="powertools-python")`` Powertools' own,
    ``<AWS_LAMBDA_FUNCTION_NAME>.<module>.<qualname>``.  The invocation's remaining time
    (and ``timeout``, seconds, if sooner) is the deadline, registered as the ambient one
    for idempotent calls the route makes (as ``idempotent_handler`` does).

    :param replayed_header: the header (value ``true``) that marks a replayed response.
    :param redaction: response fields kept out of the store, as JMESPath paths into
        ``{"headers": {name: value}, "body": <the JSON body>}`` — ``headers."<name>"``,
        ``body.<path>`` — or ``Redaction(never_store=True)``.  A manager whose ``Options``
        set ``redaction`` is refused (:class:`~idempotency_async.errors.ConfigError`): the
        stored proxy response's body is text, in which its paths would find nothing.

    See ``docs/lambda.md``.
    """
    if timeout is not None:
        check_duration("idempotent_route(timeout=)", timeout)
    replayed = _replayed_header(replayed_header)
    redaction = _route_redaction(manager, redaction)
    managers: dict[Any, Manager] = {}

    def keyed(app: Any) -> Manager:
        route = app.context.get("_route")
        func = getattr(route, "func", None)
        if func is None:
            return manager
        found = managers.get(func)
        if found is None:
            found = managers[func] = function_manager(manager, func)
        return found

    async def idempotent_route(app: Any, next_middleware: Callable[[Any], Awaitable[Any]]) -> Any:
        started: list[bool] = []  # the route ran: what it raises is its own
        ran: list[Response[Any]] = []  # and returned this response

        async def run(call: Call) -> dict[str, Any]:
            started.append(True)
            result = await next_middleware(app)
            response = result if isinstance(result, Response) else app._to_response(result)
            stored = _proxy_response(response, getattr(app, "_serializer", None), replayed)
            ran.append(response)
            if not _storable(response.status_code):
                call.release(f"the route answered {response.status_code}: not a final answer")
            elif redaction is not None:
                await _complete_redacted(call, redaction, stored)
            return stored

        deadline = invocation_deadline(app.lambda_context)
        try:
            stored = await _execute(keyed(app), app.current_event.raw_event, run, deadline, timeout)
        except _ANSWERED as exc:
            if started:
                raise  # the route's own error
            return _answer(exc, replayed)
        if ran:
            return ran[0]
        return _replay(stored, replayed)

    return idempotent_route


async def _execute(
    manager: Manager,
    event: Any,
    run: Callable[[Call], Awaitable[dict[str, Any]]],
    deadline: float | None,
    timeout: float | None,
) -> Any:
    """The route's call; the invocation's deadline is also the ambient one, so idempotent
    calls made inside the route get the same lease."""
    if deadline is None:
        return await manager.execute_call(event, run, timeout=timeout)
    with ambient_invocation_deadline(deadline):
        return await manager.execute_call(event, run, deadline=deadline, timeout=timeout)


def _replayed_header(name: Any) -> str:
    if not isinstance(name, str) or _TOKEN.fullmatch(name) is None:
        raise ConfigError(f"replayed_header must be an HTTP header name, got {name!r:.60}")
    if name.lower() in _OWNED:
        raise ConfigError(
            f"replayed_header={name!r} names a header idempotent_route strips or sends for "
            f"another purpose: choose another name (default {REPLAYED_HEADER})"
        )
    return name


def _route_redaction(manager: Manager, redaction: Any) -> Redaction | None:
    if not isinstance(manager, Manager):
        raise ConfigError(f"idempotent_route needs an idempotency_async.Manager, got {manager!r}")
    if manager.options.redaction is not None:
        raise ConfigError(
            "idempotent_route stores the route's response as an API Gateway proxy response "
            "(its body is text), in which the manager's Options(redaction=...) paths find "
            "nothing: give the fields to idempotent_route(manager, redaction=Redaction("
            "fields=('body.<path>', 'headers.\"<name>\"'))) and leave the manager's unset"
        )
    if redaction is not None and not isinstance(redaction, Redaction):
        raise ConfigError(
            f"redaction must be an idempotency_async.Redaction, got {type(redaction).__name__}"
        )
    checked = check_redaction(redaction)
    assert checked is None or isinstance(checked, Redaction)
    return checked


async def _complete_redacted(call: Call, redaction: Redaction, stored: dict[str, Any]) -> None:
    """Complete the record now with ``stored`` less the declared fields (the route's own
    caller still gets the response whole), or without a response when they cannot be
    looked for (a body that is not JSON) or the route is never stored."""
    if redaction.never_store:
        await call.complete_without_response(NEVER_STORED)
        return
    redacted = _redact(redaction, stored)
    if isinstance(redacted, str):
        await call.complete_without_response(redacted)
    else:
        await call.complete(redacted)


def _redact(redaction: Redaction, stored: dict[str, Any]) -> dict[str, Any] | str:
    """``stored`` without the declared header and body fields (marked redacted when one was
    found), or why its body cannot be stored."""
    names = {str(path.steps[1]).lower() for path in redaction.paths if path.steps[0] == "headers"}
    headers = {
        name: value for name, value in stored["headers"].items() if name.lower() not in names
    }
    removed = len(headers) < len(stored["headers"])
    body = stored["body"]
    body_paths = [path.steps[1:] for path in redaction.paths if path.steps[0] == "body"]
    if body_paths and body:
        if stored["isBase64Encoded"]:
            return "declared body fields cannot be removed from a binary (Base64) body"
        try:
            value = json.loads(body)
        except ValueError:
            return "declared body fields cannot be removed from a body that is not JSON"
        changed = False
        for steps in body_paths:
            value, hit = remove(value, steps)
            changed = changed or hit
        if changed:
            body = _default_serializer(value)
            removed = True
            # The ETag described the body as sent, not as stored.
            headers = {name: v for name, v in headers.items() if name.lower() != "etag"}
    if not removed:
        return stored
    headers[REDACTED_HEADER] = "true"
    return {**stored, "headers": headers, "body": body}


def _storable(status: int) -> bool:
    return status < 500 and status not in _NOT_STORED_STATUSES


def _proxy_response(response: Response[Any], serializer: Any, replayed: str) -> dict[str, Any]:
    """The response as an API Gateway proxy response (what a sync handler returned to
    Powertools' ``@idempotent``); the response's body becomes the text it stores, so the
    first caller and every duplicate get the same bytes.  Cookies are never stored."""
    body = response.body
    if body is not None and not isinstance(body, str | bytes):
        # As Powertools' ResponseBuilder does for a JSON response, with the resolver's own
        # serializer when it has one.
        body = response.body = (serializer or _default_serializer)(body)
    encoded = isinstance(body, bytes)
    text = base64.b64encode(body).decode() if isinstance(body, bytes) else body
    headers = {name: value for name, value in response.headers.items() if _kept(name, replayed)}
    return {
        "statusCode": response.status_code,
        "headers": headers,
        "body": text,
        "isBase64Encoded": encoded,
    }


def _default_serializer(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"), cls=Encoder)


def _kept(name: str, replayed: str) -> bool:
    return name.lower() not in {"set-cookie", REPLAYED_HEADER.lower(), replayed.lower()}


def _replay(stored: Any, replayed: str) -> Response[Any]:
    """The stored proxy response as a Powertools ``Response``; one Powertools' sync
    ``@idempotent`` stored (``multiValueHeaders`` from a REST API) is read too."""
    if not isinstance(stored, dict) or type(stored.get("statusCode")) is not int:
        return _not_available("the stored response is not an API Gateway proxy response", replayed)
    headers: dict[str, str | list[str]] = {}
    for field in ("multiValueHeaders", "headers"):
        for name, value in (stored.get(field) or {}).items():
            if isinstance(name, str) and _kept(name, replayed) and _header_value(value):
                headers[name] = value
    body: str | bytes | None = stored.get("body")
    if body is not None and not isinstance(body, str):
        return _not_available("the stored response's body is not text", replayed)
    if stored.get("isBase64Encoded") is True and body is not None:
        try:
            body = base64.b64decode(body, validate=True)
        except (ValueError, binascii.Error):
            return _not_available("the stored response's body is not Base64", replayed)
    headers[replayed] = "true"
    return Response(status_code=stored["statusCode"], body=body, headers=headers)


def _header_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return isinstance(value, str)


def _answer(error: Exception, replayed: str) -> Response[Any]:
    """A duplicate's answer when the route did not run (and nothing is replayed)."""
    if isinstance(error, AlreadyInProgressError):
        wait = 1 if error.retry_after is None else max(1, math.ceil(error.retry_after))
        return _problem(
            409,
            "Request in progress",
            "a request with this key is still being processed: retry after the Retry-After "
            "header's seconds",
            {"Retry-After": str(wait)},
        )
    if isinstance(error, PayloadError):  # KeyMissingError included
        return _problem(400, "Idempotency key missing or invalid", str(error)[:300])
    if isinstance(error, PayloadValidationError):
        return _problem(
            422,
            "Idempotency key reused",
            "this key was already used with a different request: send the original request "
            "unchanged, or use a new key",
        )
    return _not_available(getattr(error, "reason", None) or "no reason recorded", replayed)


def _not_available(why: str, replayed: str) -> Response[Any]:
    return _problem(
        409,
        "Response not available",
        f"the request with this key was processed, but its response was not stored ({why}), "
        "so it cannot be replayed",
        {replayed: "true"},
    )


def _problem(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None
) -> Response[Any]:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return Response(status_code=status, content_type=_PROBLEM, body=body, headers=headers)
