"""What the Lambda context tells an invocation: the moment Lambda ends it."""

from __future__ import annotations

import asyncio

__all__ = ["invocation_deadline"]


def invocation_deadline(context: object) -> float | None:
    """The ``loop.time()`` at which Lambda ends this invocation, from its context.

    ``None`` when the context does not say (local runs without a Lambda context).
    """
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    millis = float(remaining())
    return asyncio.get_running_loop().time() + max(millis, 0.0) / 1000
