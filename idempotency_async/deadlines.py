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
    "effective_deadline",
    "reserve_for",
]

_ambient: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "idempotency_async_deadline", default=None
)

_MAX_RESERVE = 0.5
_RESERVE_SHARE = 0.2


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


def effective_deadline(
    loop: asyncio.AbstractEventLoop, *, deadline: float | None, timeout: float | None
) -> float | None:
    """The earliest of an explicit deadline, a timeout from now and the ambient deadline.

    ``timeout`` must be a finite positive number and ``deadline`` a finite one: anything
    else (NaN, infinities, a timeout <= 0) is :class:`~idempotency_async.errors.ConfigError`
    here, at the call, rather than a lease that never lapses or an overflow later.
    """
    ambient = _ambient.get()
    if (
        deadline is None
        and ambient is None
        and timeout is not None
        and (timeout.__class__ is float or timeout.__class__ is int)
        and 0 < timeout < math.inf  # False for NaN
    ):
        return loop.time() + timeout  # the common case, cheaply
    candidates = [] if ambient is None else [ambient]
    if deadline is not None:
        candidates.append(check_instant("deadline", deadline))
    if timeout is not None:
        candidates.append(loop.time() + check_duration("timeout", timeout))
    return min(candidates) if candidates else None


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


def reserve_for(time_left: float, override: float | None = None) -> float:
    """Time kept back between the callback's cutoff and the lease end for the completion
    write: min(0.5 s, 20 % of the time left), or ``override`` (never more than the time left)."""
    if override is not None:
        return min(override, time_left)
    return min(_MAX_RESERVE, _RESERVE_SHARE * time_left)
