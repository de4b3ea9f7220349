"""The manager a decorated function runs: the one it was given, keyed by the function.

Shared by :func:`~idempotency_async.decorators.idempotent_function`, the Lambda handler
decorator and the CLI's ``key --function``, so all three derive the same keys.
"""

from __future__ import annotations

from collections.abc import Callable

from idempotency_async._derive import derive
from idempotency_async._keys import function_prefix
from idempotency_async.manager import Manager

__all__ = ["function_manager"]


def function_manager(
    manager: Manager, func: Callable[..., object], *, handler: bool = False
) -> Manager:
    """The decorator's derivation: it owns nothing, and adjusts only an implicit prefix
    (the function's, or Powertools' for ``key_format="powertools-python"``; ``handler``
    picks Powertools' prefix for a Lambda handler)."""
    prefix = function_prefix(manager.options, func, handler=handler)
    if prefix is None:
        return derive(manager, "idempotent_function", {})
    return derive(manager, "idempotent_function", {}, kept={"key_prefix": prefix})
