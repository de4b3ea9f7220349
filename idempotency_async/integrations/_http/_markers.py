"""Per-route opt-in: the request state a marker reads and sets, and which dependencies mark.

A marker (FastAPI's ``idempotency_dependency``, aiohttp's ``@idempotent_endpoint``) opts a
route in whatever its method and path, and tells the response gate whether a response
was produced by the endpoint: one produced while :attr:`RequestState.endpoint_ran` is
False (request validation, an auth rejection) is forwarded and never stored.

A transactional marker (FastAPI's ``idempotent_transaction``, aiohttp's
``@transactional_endpoint``) says more: the middleware must not claim the key, the
endpoint records its response in its own database transaction (:mod:`._transaction`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from idempotency_async.integrations._http._transaction import HttpTransaction

__all__ = ["Marks", "RequestState", "register_marker", "route_marks"]


@dataclass(slots=True)
class RequestState:
    """What a middleware knows about one request (each adapter's ``request_state()``)."""

    key: str | None
    """The request's Idempotency-Key (unquoted), or None when it sent none."""
    endpoint_ran: bool = False
    """On opted-in routes, the marker's word on whether the endpoint ran: set when the
    FastAPI dependency or aiohttp decorator is entered, cleared when the endpoint (or,
    for FastAPI, request validation) raises.  A response started while it is False was
    not produced by the endpoint: it is forwarded and never stored."""
    transaction: HttpTransaction[Any] | None = None
    """On transactional routes, the request's
    :class:`~idempotency_async.integrations._http._transaction.HttpTransaction` (its key,
    scope and fingerprint), set by the middleware before the endpoint runs."""


class Marks(NamedTuple):
    """What the markers among a route's dependencies say."""

    marked: bool
    """The route is opted in, whatever its method and path."""
    required: bool
    """The route requires the Idempotency-Key header."""
    transactional: bool
    """The endpoint records its response in its own transaction: never claim for it."""


# Dependencies that opt a route in, each with whether it requires the key and whether it
# makes the route transactional.  FastAPI's module registers its own at import; the
# Starlette middleware reads them.
_MARKERS: dict[Callable[..., Any], tuple[bool, bool]] = {}


def register_marker(
    dependency: Callable[..., Any], *, requires_key: bool, transactional: bool = False
) -> None:
    """Make ``dependency`` opt in the routes that depend on it (directly or not)."""
    _MARKERS[dependency] = (requires_key, transactional)


def route_marks(dependant: Any) -> Marks:
    """What the markers among a route's dependencies say (a FastAPI ``Dependant`` tree;
    anything without ``call``/``dependencies`` marks nothing)."""
    marked = required = transactional = False
    stack = [dependant]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        call = getattr(node, "call", None)
        for marker, (requires_key, in_transaction) in _MARKERS.items():
            if call is marker:
                marked = True
                required = required or requires_key
                transactional = transactional or in_transaction
        stack.extend(getattr(node, "dependencies", ()))
    return Marks(marked, required, transactional)
