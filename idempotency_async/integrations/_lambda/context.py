"""What the Lambda context tells an invocation: the moment Lambda ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from idempotency_async._lease import AMBIENT

__all__ = ["ambient_invocation_deadline", "invocation_deadline"]


def invocation_deadline(context: object) -> float | None:
    """The ``loop.time()`` at which Lambda ends this invocation, from its context.

    ``None`` when the context does not say (local runs without a Lambda context).
    """
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    millis = float(remaining())
    return asyncio.get_running_loop().time() + max(millis, 0.0) / 1000


@contextmanager
def ambient_invocation_deadline(when: float) -> Iterator[None]:
    """Register ``when`` as the ambient deadline of the block (the earlier of it and an
    outer one), so idempotent calls made inside it get a lease that ends with the
    invocation.

    Only registered, not enforced with ``asyncio.timeout_at`` as
    :func:`idempotency_async.deadlines.deadline` does: the invocation's own idempotent
    call is bounded by the manager's cutoff, and a duplicate waiting (``Options(wait=...)``)
    until the deadline must get the manager's answer (``DeadlineExceededError``), not a
    bare ``TimeoutError`` raised by a timer on the same instant.
    """
    outer = AMBIENT.get()
    token = AMBIENT.set(when if outer is None else min(when, outer))
    try:
        yield
    finally:
        AMBIENT.reset(token)
