"""What a transactional FastAPI route's work returns, made into the response the route
would send for it.

A plain FastAPI endpoint returns a dict or a model and FastAPI serializes it *after* the
endpoint returned; a transactional endpoint's response must be recorded *before* its
COMMIT, inside the endpoint.  So the value is serialized here, in the savepoint, the way
FastAPI's request handler serializes an endpoint's return value for this route: its
response field (``response_model`` or the return annotation) with the route's include,
exclude, alias and unset/default/None settings; its ``status_code``, unless the
``Response`` parameter's status was set; its ``response_class``; the ``Response``
parameter's headers; no body where the status allows none.  The endpoint returns this
response, so what was recorded is exactly what goes out; FastAPI attaches the request's
background tasks to it as to any returned response.

The steps follow FastAPI's ``get_request_handler``; ``tests/test_http_transactions_fastapi.py``
compares a plain and a transactional twin of each kind of route byte for byte, on every
FastAPI version the project supports (``.ci/versions``).
"""

from __future__ import annotations

import inspect
from collections.abc import MutableMapping
from typing import Any, Final

from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute, serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from starlette.responses import Response

from idempotency_async.integrations.starlette import Responses

__all__ = ["RouteResponses"]

# Keyword arguments of serialize_response that appeared in later FastAPI versions.
_SERIALIZE_PARAMETERS: Final = frozenset(inspect.signature(serialize_response).parameters)
# Where FastAPI (0.13x and later) keeps the settings of a route as included by a router
# (prefix, default response class...) when they differ from the route object's own.
_SCOPE_KEY: Final = "fastapi"
_EFFECTIVE_ROUTE: Final = "effective_route_context"


class RouteResponses(Responses):
    """FastAPI's responses for one request to a transactional route."""

    def __init__(self, route: APIRoute, scope: MutableMapping[str, Any], sub: Response) -> None:
        self._settings = _effective(route, scope)
        self._sub = sub

    async def respond(self, value: object) -> Response:
        if isinstance(value, Response):
            return value
        settings, sub = self._settings, self._sub
        # FastAPI ≤ 0.11x serializes with a cloned field; later versions with the field.
        field = getattr(settings, "secure_cloned_response_field", None) or getattr(
            settings, "response_field", None
        )
        response_class = settings.response_class
        default_class = isinstance(response_class, DefaultPlaceholder)
        actual_class = response_class.value if default_class else response_class
        arguments: dict[str, Any] = {
            "field": field,
            "response_content": value,
            "include": settings.response_model_include,
            "exclude": settings.response_model_exclude,
            "by_alias": settings.response_model_by_alias,
            "exclude_unset": settings.response_model_exclude_unset,
            "exclude_defaults": settings.response_model_exclude_defaults,
            "exclude_none": settings.response_model_exclude_none,
            "is_coroutine": True,  # the endpoint awaits run(): it is a coroutine function
        }
        # FastAPI's fast path: a response field and no response class of the route's own
        # serialize straight to JSON bytes.
        dump_json = "dump_json" in _SERIALIZE_PARAMETERS and field is not None and default_class
        if "dump_json" in _SERIALIZE_PARAMETERS:
            arguments["dump_json"] = dump_json
        content = await serialize_response(**arguments)
        response_args: dict[str, Any] = {}
        status = settings.status_code if settings.status_code else sub.status_code
        if status is not None:
            response_args["status_code"] = status
        if sub.status_code:
            response_args["status_code"] = sub.status_code
        if dump_json:
            response = Response(content=content, media_type="application/json", **response_args)
        else:
            response = actual_class(content, **response_args)
        if not is_body_allowed_for_status_code(response.status_code):
            response.body = b""
        response.headers.raw.extend(sub.headers.raw)
        return response


def _effective(route: APIRoute, scope: MutableMapping[str, Any]) -> Any:
    """The route's settings as this request's router applies them."""
    context = scope.get(_SCOPE_KEY, {})
    effective = context.get(_EFFECTIVE_ROUTE) if isinstance(context, dict) else None
    if effective is not None and getattr(effective, "original_route", None) is route:
        return effective
    return route
