"""Deadlines: where a call's time limit comes from, and how it becomes a lease.

A deadline is an absolute ``loop.time()`` value, like ``asyncio.timeout_at`` takes.
Sources, earliest wins: ``execute(timeout=…)``, ``execute(deadline=…)``, the ambient
``async with deadline(…)`` of the calling task, and the Lambda context's remaining time
registered by the Lambda integration (through the same context variable).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from idempotency_async._lease import AMBIENT, check_duration, check_instant
from idempotency_async.errors import ConfigError

__all__ = ["current_deadline", "deadline"]


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
    outer = AMBIENT.get()
    if outer is not None:
        when = min(when, outer)
    token = AMBIENT.set(when)
    try:
        async with asyncio.timeout_at(when):
            yield when
    finally:
        AMBIENT.reset(token)


def current_deadline() -> float | None:
    """The ambient deadline of the calling task, if any (``loop.time()`` units)."""
    return AMBIENT.get()
