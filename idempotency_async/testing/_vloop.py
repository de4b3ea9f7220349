"""A virtual-time event loop: timers fire in order, instantly, with no real waiting.

When every task is waiting on a timer, the loop's clock jumps straight to the earliest
one, so a simulation runs hours of leases in milliseconds.  It has no real I/O: a loop
with nothing ready and no timer is deadlocked, and says so instead of hanging.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Mapping
from typing import Any

__all__ = ["Deadlock", "VirtualClockLoop"]


class Deadlock(RuntimeError):
    """Every task waits for something that no timer will ever bring."""


class _Map(Mapping[Any, selectors.SelectorKey]):
    def __init__(self, keys: dict[Any, selectors.SelectorKey]) -> None:
        self._keys = keys

    def __getitem__(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys[fileobj]

    def __iter__(self) -> Any:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class _TimeSelector(selectors.BaseSelector):
    """A selector that never polls: waiting for ``timeout`` moves the clock instead."""

    def __init__(self) -> None:
        self.loop: VirtualClockLoop | None = None
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        assert loop is not None
        if timeout is None:
            raise Deadlock("every task waits, and no timer is scheduled")
        if math.isnan(timeout):
            raise Deadlock("a timer was scheduled at NaN: the loop can no longer order timers")
        loop.iterations += 1
        if loop.iterations > loop.iteration_limit:
            # Counted, not timed: the verdict is the same on a busy machine and a quiet one,
            # and a rerun of the seed reaches it again.
            raise Deadlock(
                f"the scenario ran {loop.iteration_limit:,} loop iterations without ending: a "
                "livelock (a timer that never comes due, or tasks waking each other forever)"
            )
        if timeout > 0:
            loop.jump()
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return _Map(self._keys)

    def close(self) -> None:
        self._keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is virtual and jumps to the next timer when idle.

    :meth:`advance` moves the clock without running anything, as a callback that blocks
    the loop would.
    """

    def __init__(self, start: float = 0.0, iteration_limit: int = 2_000_000) -> None:
        selector = _TimeSelector()
        self._now = start
        self.iteration_limit = iteration_limit
        """How many times the loop may wait before the run counts as a livelock."""
        self.iterations = 0
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def jump(self) -> None:
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if any(math.isnan(handle.when()) for handle in scheduled):
            raise Deadlock("a timer was scheduled at NaN: the loop can no longer order timers")
        if scheduled and math.isinf(scheduled[0].when()):
            raise Deadlock("every task waits, and the next timer is at infinity")
        if scheduled:
            # Exactly the timer's time: adding a difference can land a hair short of it.
            self._now = max(self._now, scheduled[0].when())
