"""Callbacks that return something other than an awaitable: a plain function passed by mistake.

``execute(payload, charge)`` with a plain ``def charge()`` runs ``charge`` — its side effect
happens — and only then would ``await`` fail.  The call cannot be undone, so it must not be
released (a retry would run it again): the lifecycle completes the record without a response
and raises :class:`~idempotency_async.errors.ConfigError`.  Checking costs nothing on the
usual path: coroutines have ``__await__``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

from idempotency_async.errors import ConfigError

__all__ = [
    "ReturnedNotAwaitable",
    "awaitable",
    "checked",
    "not_awaitable_error",
    "not_awaitable_reason",
]

T = TypeVar("T")


class ReturnedNotAwaitable(ConfigError):
    """Raised where a callback's return value would be awaited and is not awaitable.

    Every door of the lifecycle turns it into a plain ``ConfigError`` before it leaves the
    manager (after completing the record without a response when there is one), so one
    seen by a lifecycle is always about that call's own callback — never about a nested
    call inside it.
    """

    def __init__(self, value: object) -> None:
        super().__init__(str(not_awaitable_error(value, None)))
        self.value = value


def awaitable(pending: Awaitable[T]) -> Awaitable[T]:
    """``pending`` if it can be awaited, else :class:`ReturnedNotAwaitable` (typed as an
    awaitable: what the caller was promised, and did not get)."""
    if hasattr(pending, "__await__") or inspect.isawaitable(pending):
        return pending
    raise ReturnedNotAwaitable(pending)


def checked(callback: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """``callback``, raising :class:`ReturnedNotAwaitable` in place of returning a value
    that is not awaitable (for wrappers, such as telemetry's, that await it themselves)."""

    def call() -> Awaitable[T]:
        return awaitable(callback())

    return call


def not_awaitable_reason(value: object) -> str:
    """Why the record of such a call holds no response (replays name it)."""
    return f"the callback returned {type(value).__name__}, not an awaitable"


def not_awaitable_error(value: object, key: str | None) -> ConfigError:
    where = "" if key is None else f"; key {key} was completed without a response"
    return ConfigError(
        f"the callback returned {type(value).__name__}, not an awaitable: it ran (a plain "
        f"function, not a coroutine function){where}, so retries are not run again but "
        "replay ResponseNotStoredError. Pass an async callable, e.g. lambda: charge(order) "
        "with `async def charge`"
    )
