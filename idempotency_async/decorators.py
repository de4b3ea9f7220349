"""``idempotent_function``: make any ``async def`` idempotent on one of its arguments."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Generic, ParamSpec, Protocol, TypeVar, cast

from idempotency_async._arguments import argument_reader
from idempotency_async._derive import derive
from idempotency_async._function_manager import function_manager
from idempotency_async._lease import check_duration
from idempotency_async._replayed import ReplayErrorsSetting, declared_errors
from idempotency_async.errors import ConfigError
from idempotency_async.manager import Manager

__all__ = ["IdempotentFunction", "idempotent_function"]

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class IdempotentFunction(Protocol, Generic[P, T_co]):
    """What :func:`idempotent_function` returns: the function, with the manager it runs."""

    manager: Manager
    """The manager the function's calls run through: ``manager.key_for(value)`` is the key
    of a call with that argument, and ``manager.force_release(key)`` releases it."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T_co]: ...


def idempotent_function(
    manager: Manager,
    *,
    payload: str,
    timeout: float | None = None,
    replay_errors: ReplayErrorsSetting | None = None,
) -> Callable[[Callable[P, Awaitable[T]]], IdempotentFunction[P, T]]:
    """Decorate an ``async def`` so it runs once per value of its ``payload`` argument.

    When the manager's ``key_prefix`` was not set explicitly, keys get the function's
    ``<module>.<qualname>`` appended, so two functions sharing a manager never replay
    each other's results (with ``key_format="powertools-python"``, Powertools' prefix
    ``<AWS_LAMBDA_FUNCTION_NAME or "test-func">.<module>.<qualname>``).  The manager the
    function runs (that derived one, or ``manager`` itself) is its ``.manager`` attribute:
    ``func.manager.key_for(value)`` is the key a call with that argument stores under.
    Dataclass arguments are hashed by their fields, pydantic models by
    ``model_dump(mode="json")``.  ``timeout`` bounds each call (and its lease): a finite
    positive number of seconds, checked here, at decoration.  ``replay_errors`` declares
    errors that are the function's result (e.g. ``(CardDeclined,)``): they complete the
    record and are raised again to every duplicate, instead of releasing the key; it
    replaces the manager's own ``Options.replay_errors`` for this function.
    """
    if timeout is not None:
        check_duration("idempotent_function(timeout=)", timeout)
    declared = declared_errors(replay_errors)  # checked here, at decoration

    def decorate(func: Callable[P, Awaitable[T]]) -> IdempotentFunction[P, T]:
        if not inspect.iscoroutinefunction(func):
            raise ConfigError(f"idempotent_function needs an async def; {func!r} is not one")
        signature = inspect.signature(func)
        if payload not in signature.parameters:
            raise ConfigError(
                f"{func.__qualname__} has no parameter {payload!r}; name the argument that "
                f"identifies the request (one of: {', '.join(signature.parameters)})"
            )
        read = argument_reader(signature, payload)
        bound_manager = function_manager(manager, func)
        if declared is not None:
            bound_manager = derive(
                bound_manager, "idempotent_function", {}, kept={"replay_errors": declared}
            )

        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            return await bound_manager.execute(
                read(args, kwargs), lambda: func(*args, **kwargs), timeout=timeout
            )

        decorated = cast(IdempotentFunction[P, T], wrapper)
        decorated.manager = bound_manager
        return decorated

    return decorate
