"""``idempotent_handler``: an ``async def handler(event, context)`` that runs once per key."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from idempotency_async._function_manager import function_manager
from idempotency_async.errors import ConfigError
from idempotency_async.integrations._lambda.context import (
    ambient_invocation_deadline,
    invocation_deadline,
)
from idempotency_async.manager import Manager

__all__ = ["idempotent_handler"]

_log = logging.getLogger("idempotency_async.aws_lambda")

E = TypeVar("E")
C = TypeVar("C")
T = TypeVar("T")


def idempotent_handler(
    manager: Manager,
) -> Callable[[Callable[[E, C], Awaitable[T]]], Callable[[E, C], Awaitable[T]]]:
    """Decorate ``async def handler(event, context)`` so it runs once per key.

    The whole event is the payload (the manager's ``event_key_jmespath`` selects the
    identity from it).  The time the Lambda context has left becomes the deadline of
    the call, so its lease ends when the invocation would be killed: after a timeout the
    key is claimable again at once.  The return value — API Gateway and ALB proxy
    responses included — is stored and replayed to duplicates.  A duplicate that arrives
    while the first invocation still runs raises
    :class:`~idempotency_async.errors.AlreadyInProgressError`.

    With ``Options(key_format="powertools-python")`` and no explicit ``key_prefix``, keys
    carry Powertools' prefix for the handler, ``<AWS_LAMBDA_FUNCTION_NAME>.<module>.<qualname>``,
    as ``@idempotent`` gives them.
    """
    if manager.options.event_key_jmespath is None:
        _log.warning(
            "idempotent_handler: the manager has no event_key_jmespath, so the whole event is "
            "hashed. Per-delivery fields (requestContext.requestId, receiptHandle, trace "
            "headers, timestamps) change on every retry, so retries will not be recognised: "
            "select what identifies the request, e.g. "
            "Options(event_key_jmespath='powertools_json(body).order_id')",
            extra={"idempotency_prefix": manager.key_prefix},
        )

    def decorate(handler: Callable[[E, C], Awaitable[T]]) -> Callable[[E, C], Awaitable[T]]:
        if not inspect.iscoroutinefunction(handler):
            raise ConfigError(
                f"idempotent_handler needs an `async def handler(event, context)`; {handler!r} "
                "is not one (wrap it with lambda_entrypoint to give Lambda a sync function)"
            )
        keyed = function_manager(manager, handler, handler=True)

        @functools.wraps(handler)
        async def wrapper(event: E, context: C) -> T:
            when = invocation_deadline(context)
            if when is None:
                return await keyed.execute(event, lambda: handler(event, context))
            # Registered as the ambient deadline too, so idempotent calls made inside the
            # handler get the same lease.
            with ambient_invocation_deadline(when):
                return await keyed.execute(event, lambda: handler(event, context), deadline=when)

        return wrapper

    return decorate
