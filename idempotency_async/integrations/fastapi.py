"""Per-route Idempotency-Key opt-in for FastAPI.

A dependency cannot see the response, so the dependencies here only mark the route, name
the ``Idempotency-Key`` header in the OpenAPI schema and tell the middleware that the
endpoint ran; the claim, the response capture and the replay happen in
:class:`~idempotency_async.integrations.starlette.IdempotencyMiddleware`, which must be
installed on the app:

.. code-block:: python

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, manager=manager, paths=())

    @app.post("/orders", status_code=201, openapi_extra=idempotency_openapi())
    async def create_order(order: Order, key: IdempotencyKey) -> dict[str, str]:
        ...

(``paths=()``: only routes carrying a dependency are idempotent.)

A route whose work writes to PostgreSQL can record its response in its own transaction
instead (``docs/postgres.md``, "Transactional calls over HTTP"): the middleware then never
claims for it, and the endpoint runs its work through :data:`IdempotentTransaction`:

.. code-block:: python

    @app.post("/orders", status_code=201, response_model=OrderOut)
    async def create_order(order: Order, tx: IdempotentTransaction) -> Response:
        async with Session() as session, session.begin():
            # insert() returns an OrderOut (or a dict), serialized as the route would
            response = await tx.run(session, lambda: insert(session, order))
        return response  # committed: only now is the record visible to duplicates
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final, TypeAlias

from fastapi import Depends, Header, Request, Response
from fastapi.routing import APIRoute

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._fastapi_responses import RouteResponses
from idempotency_async.integrations._http import (
    DEFAULT_REPLAYED_HEADER,
    HttpSettings,
    HttpTransaction,
    RequestState,
    register_marker,
)
from idempotency_async.integrations.starlette import request_state
from idempotency_async.manager import Manager

__all__ = [
    "HttpTransaction",
    "IdempotencyKey",
    "IdempotentTransaction",
    "OptionalIdempotencyKey",
    "idempotency_dependency",
    "idempotency_openapi",
    "idempotent_transaction",
    "required_idempotency_dependency",
]

_HEADER: Final = "Idempotency-Key"
_DESCRIPTION: Final = (
    "A unique value per operation (e.g. a UUID), sent again unchanged when retrying it: "
    "the operation runs once and every retry gets its response. 1 to 255 printable ASCII "
    'characters, bare or as a quoted string ("abc").'
)


async def idempotency_dependency(
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias=_HEADER, description=_DESCRIPTION)] = None,
) -> AsyncIterator[str | None]:
    """Opt a route in to Idempotency-Key handling; yields the request's key (or None).

    Use as ``Depends(idempotency_dependency)`` in the endpoint's parameters or the route's
    ``dependencies=[...]``.  A request without the header runs without idempotency unless
    the middleware has ``required=True``.  The response is stored only when the endpoint
    *returned*: when request validation, another dependency or the endpoint raised
    (``HTTPException`` included), the key is released and the response is not stored.
    """
    state = _state(request)
    async with _running(state):
        yield state.key


async def required_idempotency_dependency(
    request: Request,
    idempotency_key: Annotated[str, Header(alias=_HEADER, description=_DESCRIPTION)],
) -> AsyncIterator[str]:
    """As :func:`idempotency_dependency`, but the route requires the key, whatever the
    middleware's ``required``: a request without it is answered 400 before the endpoint
    runs, so the endpoint always receives a ``str``."""
    state = _state(request)
    if state.key is None:  # the middleware answers 400 first; never reached
        raise ConfigError("the Idempotency-Key is missing although the route requires it")
    async with _running(state):
        yield state.key


@asynccontextmanager
async def _running(state: RequestState) -> AsyncIterator[None]:
    """Tell the middleware the endpoint runs, until request validation or the endpoint
    raises: a response started meanwhile is the endpoint's."""
    state.endpoint_ran = True
    try:
        yield
    except BaseException:
        state.endpoint_ran = False
        raise


def _state(request: Request) -> RequestState:
    state = request_state(request.scope)
    if state is None:
        raise ConfigError(
            "this route's Idempotency-Key dependency needs IdempotencyMiddleware on the "
            "application: app.add_middleware(IdempotencyMiddleware, manager=...)"
        )
    return state


async def idempotent_transaction(
    request: Request,
    response: Response,
    idempotency_key: Annotated[str, Header(alias=_HEADER, description=_DESCRIPTION)],
) -> AsyncIterator[HttpTransaction[Response]]:
    """Make a route transactional; yields the request's :class:`HttpTransaction`.

    The middleware does not claim the key for the route: it replays a committed response
    (or answers 409/422) without running the endpoint, and otherwise runs it.  The endpoint
    opens its database transaction, calls ``await tx.run(connection_or_session, work)``
    — ``work()`` writes through that connection and returns what a plain route returns
    (a dict, a model, a ``Response``), serialized as this route serializes its endpoint's
    return value — commits, then returns what ``run`` returned (a ``Response``: declare
    the model with ``response_model=``).  The record commits with the work's writes, or
    not at all; the COMMIT is the point of no return.  The key is required (400 without
    it).  An endpoint that returns a response without having run its transaction gets a
    500 instead (logged, and the ``transaction_not_run`` event).
    """
    state = _state(request)
    transaction = state.transaction
    if not isinstance(transaction, HttpTransaction):  # the middleware sets it; never reached
        raise ConfigError("this transactional route's request has no transaction state")
    route = request.scope.get("route")
    if isinstance(route, APIRoute):
        transaction.kind = RouteResponses(route, request.scope, response)
    async with _running(state):
        yield transaction


register_marker(idempotency_dependency, requires_key=False)
register_marker(required_idempotency_dependency, requires_key=True)
register_marker(idempotent_transaction, requires_key=True, transactional=True)

IdempotencyKey: TypeAlias = Annotated[str, Depends(required_idempotency_dependency)]
"""Endpoint parameter type that opts the route in, requires the key and receives it."""

OptionalIdempotencyKey: TypeAlias = Annotated[str | None, Depends(idempotency_dependency)]
"""Endpoint parameter type that opts the route in and receives the key, or None when the
request sent none (it then runs without idempotency unless the middleware requires keys)."""

IdempotentTransaction: TypeAlias = Annotated[
    HttpTransaction[Response], Depends(idempotent_transaction)
]
"""Endpoint parameter type that makes the route transactional (see
:func:`idempotent_transaction`): the endpoint receives the request's
:class:`HttpTransaction` (``.key``, ``.scope``, ``.fingerprint``, ``.run(...)``)."""


def _problem(description: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
    }
    return {"description": description, "content": {"application/problem+json": {"schema": schema}}}


def idempotency_openapi(
    manager: Manager | None = None, *, replayed_header: str = DEFAULT_REPLAYED_HEADER
) -> dict[str, Any]:
    """The answers the middleware adds to a route, for the route's ``openapi_extra``.

    FastAPI merges it into the operation after its own responses, so the 422 of request
    validation stays documented beside the middleware's.  Pass the ``manager`` the
    middleware is given to publish the key lifetime (its ``Options.expires_after``), and
    the middleware's ``replayed_header`` if you changed it: both go in the descriptions and
    in the operation's ``x-idempotency`` extension (``keyHeader``, ``replayedHeader``,
    ``keyLifetimeSeconds``).  A new dict on every call.
    """
    HttpSettings(replayed_header=replayed_header)  # the same check as the middleware's
    lifetime = None if manager is None else manager.options.expires_after
    remembered = (
        ""
        if lifetime is None
        else f" A key is remembered for {lifetime:g} seconds after its request completed; "
        "a request sent later with it runs again."
    )
    extension: dict[str, Any] = {"keyHeader": _HEADER, "replayedHeader": replayed_header}
    if lifetime is not None:
        extension["keyLifetimeSeconds"] = lifetime
    retry_after = {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
    return {
        "responses": {
            "400": _problem("The Idempotency-Key is invalid, or missing where it is required."),
            "409": {
                **_problem(
                    "A request with this Idempotency-Key is still being processed: retry after "
                    "the Retry-After header's seconds. (A duplicate of a request whose response "
                    f"was not stored is answered 409 too, marked with {replayed_header}: true.)"
                ),
                "headers": {"Retry-After": retry_after},
            },
            "422": _problem(
                "Validation error, or this Idempotency-Key was already used with a different "
                "request (method, path, query or body)." + remembered
            ),
        },
        "x-idempotency": extension,
    }
