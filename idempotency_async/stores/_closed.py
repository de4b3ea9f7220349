"""The one error every store (and the light DynamoDB client) raises when used after
``aclose()``: a typed :class:`~idempotency_async.errors.ConfigError`, worded the same way."""

from __future__ import annotations

from idempotency_async.errors import ConfigError

__all__ = ["closed_error"]


def closed_error(what: str) -> ConfigError:
    """The error for a use of ``what`` (``"RedisStore"``, ...) after it was closed."""
    # A closed store never reopens (its client may be gone with it): using one is a
    # lifecycle mistake of the application, so the message says how to fix it.
    return ConfigError(
        f"this {what} was closed (aclose() or the end of `async with`); create a new one"
    )
