"""Crash points: a call's awaits, counted, and its task cancelled at the n-th.

The kit counts every await of a call's task (``stepping``); a target whose handler runs
its work in tasks of its own counts theirs too, on the same counter: ``child_tasks``
(the tasks the call's task creates directly, e.g. ``process_batch``'s one per record) or
``stepping`` called where the work runs (an aiohttp middleware of the kit's, in the task
aiohttp handles the request in).  At the n-th await counted, the task making it is
cancelled, as a crash's cancellation would be: the record's task, not the whole batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from typing import Any

__all__ = ["STEPS", "Steps", "child_tasks", "stepping"]


class Steps:
    """One call's await counter (shared by the tasks it is counted in)."""

    def __init__(self, cancel_at: int | None, on_cancel: Callable[[], None]) -> None:
        self.count = 0
        self.cancel_at = cancel_at
        self.cancelled = False
        self.on_cancel = on_cancel
        self.task: asyncio.Task[Any] | None = None
        """The call's own task."""


STEPS: contextvars.ContextVar[Steps | None] = contextvars.ContextVar("kit_steps", default=None)


@types.coroutine
def stepping(coro: Awaitable[Any], steps: Steps) -> Generator[Any, Any, Any]:
    """Await ``coro`` counting its awaits; at the ``cancel_at``-th, cancel the task (the
    await it is suspended in raises ``CancelledError``, as a crash's cancellation would)."""
    iterator = coro.__await__()
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = iterator.send(value) if error is None else iterator.throw(error)
        except StopIteration as stop:
            return stop.value
        steps.count += 1
        if steps.count == steps.cancel_at:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            steps.cancelled = True
            steps.on_cancel()
        try:
            value, error = (yield yielded), None
        except BaseException as exc:
            value, error = None, exc


async def _counted(coro: Coroutine[Any, Any, Any], steps: Steps) -> Any:
    return await stepping(coro, steps)


@contextlib.contextmanager
def child_tasks(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While inside, a task created directly by a call's task is counted in its steps."""
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        steps = STEPS.get()
        if steps is not None and steps.task is not None and asyncio.current_task() is steps.task:
            coro = _counted(coro, steps)
        if previous is not None:
            return previous(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        yield
    finally:
        loop.set_task_factory(previous)
