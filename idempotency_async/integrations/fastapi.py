"""Per-route Idempotency-Key opt-in for FastAPI.

A dependency cannot see the response, so :func:`idempotency_dependency` only marks the
route and tells the middleware that the endpoint ran; the claim, the response capture and
the replay happen in :class:`~idempotency_async.integrations.starlette.IdempotencyMiddleware`,
which must be installed on the app:

.. code-block:: python

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, manager=manager, paths=())

    @app.post("/orders", status_code=201)
    async def create_order(order: Order, key: IdempotencyKey) -> dict[str, str]:
        ...

(``paths=()``: only routes carrying the dependency are idempotent.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, TypeAlias

from fastapi import Depends, Request

from idempotency_async.errors import ConfigError
from idempotency_async.integrations.starlette import _ROUTE_MARKERS, request_state

__all__ = ["IdempotencyKey", "idempotency_dependency"]


async def idempotency_dependency(request: Request) -> AsyncIterator[str | None]:
    """Opt a route in to Idempotency-Key handling; yields the request's key (or None).

    Use as ``Depends(idempotency_dependency)`` in the endpoint's parameters or the route's
    ``dependencies=[...]``.  The response is stored only when the endpoint *returned*: when
    request validation, another dependency or the endpoint raised (``HTTPException``
    included), the key is released and the response is not stored.
    """
    state = request_state(request.scope)
    if state is None:
        raise ConfigError(
            "idempotency_dependency needs IdempotencyMiddleware on the application: "
            "app.add_middleware(IdempotencyMiddleware, manager=...)"
        )
    yield state.key
    # Reached only when nothing raised between here and the end of the endpoint.
    state.endpoint_returned = True


_ROUTE_MARKERS.add(idempotency_dependency)

IdempotencyKey: TypeAlias = Annotated[str | None, Depends(idempotency_dependency)]
"""Endpoint parameter type that opts the route in and receives the key."""
