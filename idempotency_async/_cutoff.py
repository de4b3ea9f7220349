"""Cutting callbacks off at a loop time: what ``asyncio.timeout_at`` does, for less.

Every idempotent call with a deadline cuts its callback off a little before the lease
ends.  ``asyncio.timeout_at`` costs about 3 µs per use (a Timeout object, a state machine,
a timer handle per call) and was the largest single cost of a first call.  Here the
cutoffs of one event loop share one timer: starting a cutoff is a heap push, ending it
sets a flag, and the timer fires for the earliest cutoff still open.  The contract is
``asyncio.timeout``'s for the one case the manager needs — a fixed deadline around one
await — including its ``uncancel`` rules.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math

__all__ = ["Cutoff", "Cutoffs", "InsistingCutoff"]

# Closed cutoffs stay in the heap until they surface; past this many (and half the heap)
# the heap is rebuilt without them, so a busy loop with long deadlines stays small.
_COMPACT_AT = 256


class Cutoff:
    """One task's cutoff.  Use as::

        cutoff = cutoffs.start(when)
        try:
            result = await work()
        except asyncio.CancelledError:
            if cutoff.fired():      # our cancellation: the caller raises TimeoutError
                ...
            raise
        finally:
            cutoff.close()

    A cancellation that comes from elsewhere at the same time wins, as with
    ``asyncio.timeout``: :meth:`fired` is False then and the CancelledError propagates.
    """

    __slots__ = (
        "_cancelling",
        "_consumed",
        "_expired",
        "_owner",
        "_task",
        "closed",
        "queued",
        "when",
    )

    def __init__(self, owner: Cutoffs, task: asyncio.Task[object], when: float) -> None:
        self._owner = owner
        self.when = when
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._consumed = False
        self.closed = False
        self.queued = True  # still in the heap of its Cutoffs

    def expire(self) -> None:
        # Once only: a renewal may expire a cutoff whose heap entry is still queued.
        if not self.closed and not self._expired:
            self._expired = True
            self._task.cancel()

    @property
    def expired(self) -> bool:
        """Whether the cutoff fired (its task was asked to cancel)."""
        return self._expired

    def fired(self) -> bool:
        """Whether the CancelledError being handled is ours (consumes our cancel request)."""
        if not self._expired or self._consumed:
            return False
        self._consumed = True
        return self._task.uncancel() <= self._cancelling

    def cancelled_elsewhere(self) -> bool:
        """Whether the task was asked to cancel by someone else since the cutoff started
        (its caller): ask after :meth:`fired` or :meth:`close` balanced our own request."""
        return self._task.cancelling() > self._cancelling

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._expired and not self._consumed:
            # The work swallowed our cancellation: balance the task's cancel count.
            self._consumed = True
            self._task.uncancel()
        if self.queued:
            self._owner.closed_one()


class InsistingCutoff(Cutoff):
    """A cutoff that cancels its task a second time, at the next turn of the loop, if the
    work it cut off is still unwinding then: a database driver answers a cancellation by
    asking its server to cancel the statement and waiting for the answer (asyncpg, psycopg),
    and closes the connection instead on a second one.  For work to abandon, not to wait
    for (a lease renewal whose answer is late)."""

    __slots__ = ("_cancels",)

    def __init__(self, owner: Cutoffs, task: asyncio.Task[object], when: float) -> None:
        super().__init__(owner, task, when)
        self._cancels = 0

    def expire(self) -> None:
        if not self.closed and not self._expired:
            self._expired = True
            self._cancels = 1
            self._task.cancel()
            self._owner.loop.call_soon(self._insist)

    def _insist(self) -> None:
        if not self.closed and not self._consumed and not self._task.done():
            self._cancels = 2
            self._task.cancel()

    def fired(self) -> bool:
        if not self._expired or self._consumed:
            return False
        self._consumed = True
        for _ in range(self._cancels - 1):
            self._task.uncancel()
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if not self.closed and self._expired and not self._consumed:
            # The work swallowed our cancellations: balance the task's cancel count.
            self._consumed = True
            for _ in range(self._cancels):
                self._task.uncancel()
        super().close()


class Cutoffs:
    """The open cutoffs of one event loop, behind a single timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Cutoff]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        self._closed_in_heap = 0

    def start(self, when: float, *, insist: bool = False) -> Cutoff:
        """Cancel the current task at ``when`` (loop time) unless the cutoff is closed first
        (``insist``: an :class:`InsistingCutoff`, which cancels twice)."""
        task = asyncio.current_task(self.loop)
        if task is None:
            raise RuntimeError("a cutoff must be started inside a task")
        cutoff = InsistingCutoff(self, task, when) if insist else Cutoff(self, task, when)
        heapq.heappush(self._heap, (when, next(self._order), cutoff))
        if when < self._armed_at:
            self._arm(when)
        return cutoff

    def postpone(self, cutoff: Cutoff, when: float) -> None:
        """Move an open cutoff later, to ``when`` (a renewed lease).  The earlier heap entry
        stays and is skipped when it surfaces: only the entry at ``cutoff.when`` counts."""
        if cutoff.closed or cutoff.expired or when <= cutoff.when:
            return
        cutoff.when = when
        heapq.heappush(self._heap, (when, next(self._order), cutoff))
        if when < self._armed_at:
            self._arm(when)

    def closed_one(self) -> None:
        self._closed_in_heap += 1
        if self._closed_in_heap >= _COMPACT_AT and self._closed_in_heap * 2 > len(self._heap):
            for entry in self._heap:
                entry[2].queued = not entry[2].closed
            self._heap = [entry for entry in self._heap if entry[2].queued]
            heapq.heapify(self._heap)
            self._closed_in_heap = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._fire)
        self._armed_at = when

    def _fire(self) -> None:
        self._timer = None
        self._armed_at = math.inf
        heap = self._heap
        now = self.loop.time()
        while heap and (heap[0][0] <= now or heap[0][2].closed):
            when, _, cutoff = heapq.heappop(heap)
            if when != cutoff.when:
                continue  # an entry a postponement left behind
            cutoff.queued = False
            if cutoff.closed:
                self._closed_in_heap -= 1
            else:
                cutoff.expire()
        if heap:
            self._arm(heap[0][0])
