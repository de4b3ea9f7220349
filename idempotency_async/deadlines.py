"""Deadlines: where a call's time limit comes from, and how it becomes a lease.

A deadline is an absolute ``loop.time()`` value, like ``asyncio.timeout_at`` takes.
Sources, earliest wins: ``execute(timeout=…)``, ``execute(deadline=…)``, the ambient
``async with deadline(…)`` of the calling task, and the Lambda context's remaining time
registered by the Lambda integration (through the same context variable).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from idempotency_async.errors import ConfigError

__all__ = [
    "check_duration",
    "check_instant",
    "current_deadline",
    "deadline",
]

_ambient: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "idempotency_async_deadline", default=None
)


@asynccontextmanager
async def deadline(
    seconds: float | None = None, *, at: float | None = None
) -> AsyncIterator[float]:
    """Run the block under a deadline that idempotent calls inside it turn into their lease.

    Give either ``seconds`` from now or an absolute ``at`` (``loop.time()`` units).  The
    block itself is bounded with ``asyncio.timeout_at``; nested deadlines keep the earliest.
    Yields the effective deadline.  ``seconds`` must be a finite positive number and
    ``at`` a finite one (:class:`~idempotency_async.errors.ConfigError` otherwise).
    """
    if (seconds is None) == (at is None):
        raise ConfigError("deadline() takes exactly one of seconds or at=")
    if seconds is not None:
        when = asyncio.get_running_loop().time() + check_duration("deadline(seconds)", seconds)
    else:
        when = check_instant("deadline(at=)", at)
    outer = _ambient.get()
    if outer is not None:
        when = min(when, outer)
    token = _ambient.set(when)
    try:
        async with asyncio.timeout_at(when):
            yield when
    finally:
        _ambient.reset(token)


def current_deadline() -> float | None:
    """The ambient deadline of the calling task, if any (``loop.time()`` units)."""
    return _ambient.get()


def check_duration(name: str, value: object) -> float:
    """``value`` if it is a finite positive number of seconds, else ConfigError."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value < math.inf  # False for NaN
    ):
        return value
    raise ConfigError(
        f"{name} must be a finite positive number of seconds, got {value!r}: give the time "
        "the call may take (no deadline at all: leave it out)"
    )


def check_instant(name: str, value: object) -> float:
    """``value`` if it is a finite ``loop.time()`` value, else ConfigError."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    raise ConfigError(
        f"{name} must be a finite loop.time() value, got {value!r}: e.g. "
        "asyncio.get_running_loop().time() + seconds (no deadline at all: leave it out)"
    )
