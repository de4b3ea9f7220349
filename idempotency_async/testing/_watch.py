"""Watching the loop a scenario runs on: the tasks it created (none of the library's may
outlive the scenario's calls) and, in real time, how late it woke its timers (no timing
verdict may blame the library for a busy machine)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from idempotency_async.testing._trace import Trace

__all__ = ["library_tasks", "recording", "sample_lag"]

_LAG_SAMPLE: Final = 0.01
"""Real time: how often (seconds) the loop's lag is sampled."""


def recording(created: list[asyncio.Task[Any]]) -> Any:
    """A task factory that appends every task it creates to ``created``."""

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    return factory


def library_tasks(created: list[asyncio.Task[Any]]) -> list[str]:
    """Pending tasks running the library's own coroutines (none may outlive a call), of
    those the scenario's loop created (cheaper than ``asyncio.all_tasks``, which walks
    every task not yet collected)."""
    found: list[str] = []
    for task in created:
        if task.done():
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        filename = getattr(code, "co_filename", "")
        if "idempotency_async" in filename and "testing" not in filename:
            found.append(repr(task))
    return found


async def sample_lag(trace: Trace) -> None:
    """Real time: record how late the loop wakes a short timer, all along the scenario (a
    busy machine delays every timer; no timing verdict may blame the library for that)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + _LAG_SAMPLE
        await asyncio.sleep(_LAG_SAMPLE)
        now = loop.time()
        trace.lags.append((now, max(0.0, now - due)))
