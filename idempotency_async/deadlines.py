"""Deadlines: where a call's time limit comes from, and how it becomes a lease.

A deadline is an absolute ``loop.time()`` value, like ``asyncio.timeout_at`` takes.
Sources, earliest wins: ``execute(timeout=…)``, ``execute(deadline=…)``, the ambient
``async with deadline(…)`` of the calling task, and the Lambda context's remaining time
registered by the Lambda integration (through the same context variable).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from idempotency_async.errors import ConfigError

__all__ = ["current_deadline", "deadline", "effective_deadline", "reserve_for"]

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
    Yields the effective deadline.
    """
    if (seconds is None) == (at is None):
        raise ConfigError("deadline() takes exactly one of seconds or at=")
    when = asyncio.get_running_loop().time() + seconds if seconds is not None else at
    assert when is not None
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
    """The earliest of an explicit deadline, a timeout from now and the ambient deadline."""
    ambient = _ambient.get()
    if deadline is None and ambient is None and timeout is not None and timeout > 0:
        return loop.time() + timeout  # the common case, without building a list
    candidates = [when for when in (deadline, ambient) if when is not None]
    if timeout is not None:
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {timeout!r}")
        candidates.append(loop.time() + timeout)
    return min(candidates) if candidates else None


def reserve_for(time_left: float, override: float | None = None) -> float:
    """Time kept back between the callback's cutoff and the lease end for the completion
    write: min(0.5 s, 20 % of the time left), or ``override`` (never more than the time left)."""
    if override is not None:
        return min(override, time_left)
    return min(_MAX_RESERVE, _RESERVE_SHARE * time_left)
