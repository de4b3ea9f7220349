"""``lambda_entrypoint``: the synchronous function Lambda calls, on the process's one loop."""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from idempotency_async.errors import ConfigError

__all__ = ["LambdaEntrypoint", "lambda_entrypoint"]

_log = logging.getLogger("idempotency_async.aws_lambda")

E = TypeVar("E")
C = TypeVar("C")
T = TypeVar("T")


class _ProcessLoop:
    """The one event loop every entry point of the process runs on.

    A client opened on one loop (aioboto3, aiohttp, redis) cannot be used from another,
    so two entry points sharing a store must share a loop.  It opens with the first entry
    point that is invoked and closes when the last open one closes.
    """

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None
        self._users = 0

    def acquire(self) -> asyncio.Runner:
        if self._runner is None:
            self._runner = asyncio.Runner()
        self._users += 1
        return self._runner

    def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._runner is not None:
            runner, self._runner = self._runner, None
            runner.close()


_process_loop = _ProcessLoop()


class LambdaEntrypoint(Generic[E, C, T]):
    """The synchronous ``handler(event, context)`` Lambda calls; see :func:`lambda_entrypoint`.

    States: unstarted (no loop yet), running (on the process's loop, ``init`` done once it
    succeeded) and closed.  A closed entry point refuses further invocations.
    """

    def __init__(
        self,
        handler: Callable[[E, C], Awaitable[T]],
        init: Callable[[], Awaitable[object]] | None,
        shutdown: Callable[[], Awaitable[object]] | None,
    ) -> None:
        self._handler = handler
        self._init = init
        self._shutdown = shutdown
        self._runner: asyncio.Runner | None = None
        self._context: contextvars.Context | None = None
        self._initialized = init is None
        self._closed = False
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop kept across invocations (``None`` before the first one).

        Every entry point of the process runs on the same loop, so they can share stores
        and clients.
        """
        return None if self._runner is None else self._runner.get_loop()

    def __call__(self, event: E, context: C) -> T:
        _refuse_inside_a_loop(
            "a Lambda entry point was called from inside a running event loop: it is the "
            "synchronous function for Lambda's runtime. In async code (tests included), "
            "await the async handler you passed to lambda_entrypoint instead"
        )
        runner, base = self._start()
        if not self._initialized:
            assert self._init is not None
            # init runs in the base context: context variables it sets stay visible to
            # every invocation.  A failed init is retried by the next invocation.
            runner.run(_awaited(self._init), context=base)
            self._initialized = True
        # Each invocation gets its own copy, so one cannot leak context into the next.
        return runner.run(_awaited(self._handler, event, context), context=base.copy())

    def close(self) -> None:
        """Run ``shutdown`` (when ``init`` ran or nothing needed it) and leave the loop.

        The loop closes with the last open entry point of the process.  Idempotent.
        Registered with :mod:`atexit`, so it also runs when the interpreter exits normally.
        """
        if self._closed:
            return
        _refuse_inside_a_loop(
            "LambdaEntrypoint.close() was called from inside a running event loop: it runs "
            "shutdown on the entry point's own loop, so call it from synchronous code"
        )
        self._closed = True
        atexit.unregister(self._at_exit)
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            # shutdown undoes what init did: after an init that never succeeded there is
            # nothing of it to undo, and shutdown may assume what init builds.
            if self._shutdown is not None and self._initialized and self._context is not None:
                runner.run(_awaited(self._shutdown), context=self._context)
        finally:
            _process_loop.release()

    def _start(self) -> tuple[asyncio.Runner, contextvars.Context]:
        if self._closed:
            raise RuntimeError("this Lambda entry point was closed; build a new one")
        if self._runner is None or self._context is None:
            self._runner = _process_loop.acquire()
            self._context = contextvars.copy_context()
        return self._runner, self._context


def _refuse_inside_a_loop(message: str) -> None:
    # Checked before any coroutine is created, so none is left un-awaited.
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(message)


def lambda_entrypoint(
    async_handler: Callable[[E, C], Awaitable[T]],
    *,
    init: Callable[[], Awaitable[object]] | None = None,
    shutdown: Callable[[], Awaitable[object]] | None = None,
) -> LambdaEntrypoint[E, C, T]:
    """Return the synchronous ``handler(event, context)`` for Lambda's Python runtime.

    Lambda calls handlers synchronously; running each invocation with ``asyncio.run``
    would make a new event loop every time and break (or rebuild) every aioboto3 client
    created before.  The returned callable instead runs on one event loop, created on the
    first invocation and kept for the life of the execution environment; every entry point
    of the process shares it, so they can share stores and clients.  Calling it inside a
    running event loop raises ``RuntimeError`` (await ``async_handler`` there instead).
    ``init`` (async, optional) runs once on that loop before the first invocation — open
    clients, build stores — and is retried by the next invocation if it raised.
    ``shutdown`` (async, optional) runs on the loop in :meth:`LambdaEntrypoint.close`,
    e.g. ``store.aclose``::

        handler = lambda_entrypoint(handle, init=open_clients, shutdown=store.aclose)
    """
    if not (
        inspect.iscoroutinefunction(async_handler)
        or inspect.iscoroutinefunction(type(async_handler).__call__)  # async callable objects
    ):
        raise ConfigError(f"lambda_entrypoint needs an async handler; {async_handler!r} is not")
    return LambdaEntrypoint(async_handler, init, shutdown)


async def _awaited(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    # The handler's coroutine is created inside the loop's task, never before it runs.
    return await function(*args)


def _close_at_exit(ref: weakref.ref[LambdaEntrypoint[Any, Any, Any]]) -> None:
    entrypoint = ref()
    if entrypoint is None:
        return
    try:
        entrypoint.close()
    except Exception:
        _log.exception("closing the Lambda entry point at exit failed")
