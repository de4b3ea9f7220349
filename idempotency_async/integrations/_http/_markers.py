"""Per-route opt-in: the request state a marker reads and sets, and which dependencies mark.

A marker (FastAPI's ``idempotency_dependency``, aiohttp's ``@idempotent_endpoint``) opts a
route in whatever its method and path, and tells the response gate whether a response
was produced by the endpoint: one produced while :attr:`RequestState.endpoint_ran` is
False (request validation, an auth rejection) is forwarded and never stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RequestState", "register_marker", "route_marks"]


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


# Dependencies that opt a route in, each with whether it requires the key.  FastAPI's
# module registers its own at import; the Starlette middleware reads them.
_MARKERS: dict[Callable[..., Any], bool] = {}


def register_marker(dependency: Callable[..., Any], *, requires_key: bool) -> None:
    """Make ``dependency`` opt in the routes that depend on it (directly or not)."""
    _MARKERS[dependency] = requires_key


def route_marks(dependant: Any) -> tuple[bool, bool]:
    """(opted in, key required) from the markers among a route's dependencies (a FastAPI
    ``Dependant`` tree; anything without ``call``/``dependencies`` marks nothing)."""
    marked = required = False
    stack = [dependant]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        call = getattr(node, "call", None)
        for marker, requires_key in _MARKERS.items():
            if call is marker:
                marked = True
                required = required or requires_key
        stack.extend(getattr(node, "dependencies", ()))
    return marked, required
