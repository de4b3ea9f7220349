"""Cutting callbacks off at a loop time: what ``asyncio.timeout_at`` does, for less.

Every idempotent call with a deadline cuts its callback off a little before the lease
ends.  ``asyncio.timeout_at`` costs about 3 µs per use (a Timeout object, a state machine,
a timer handle per call) and was the largest single cost of a first call.  Here the
cutoffs of one event loop share one timer: starting a cutoff is a heap push, ending it
sets a flag, and the timer fires for the earliest cutoff still open.  The contract is
``asyncio.timeout``'s for the one case the manager needs — a fixed deadline around one
await — including its ``uncancel`` rules.  A cutoff is a scope, as anyio's ``CancelScope``
is: ``with cutoffs.at(when) as cutoff:`` closes it on every path out of the block.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["Cutoff", "Cutoffs", "InsistingCutoff"]

_task_of: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]
if sys.version_info < (3, 12):
    # What ``asyncio.current_task(loop)`` reads: there it is a Python function (a frame on
    # every cutoff started); 3.12 made it C.
    _task_of = vars(asyncio.tasks)["_current_tasks"].get
else:
    _task_of = asyncio.current_task

# Closed cutoffs stay in the heap until they surface; past this many (and half the heap)
# the heap is rebuilt without them, so a busy loop with long deadlines stays small.
_COMPACT_AT = 256


class Cutoff:
    """One task's cutoff.  Use as::

        try:
            with cutoffs.at(when) as cutoff:
                result = await work()
        except asyncio.CancelledError:
            if cutoff.cut_off:      # our cancellation: the caller raises TimeoutError
                ...
            raise

    Leaving the block closes the cutoff; a CancelledError leaving it is judged first
    (:attr:`cut_off`).  A cancellation that comes from elsewhere at the same time wins, as
    with ``asyncio.timeout``: ``cut_off`` is False then and the CancelledError propagates.
    """

    __slots__ = (
        "_at",
        "_cancelling",
        "_consumed",
        "_expired",
        "_owner",
        "_task",
        "closed",
        "cut_off",
        "queued",
        "when",
    )

    def __lt__(self, other: Cutoff) -> bool:
        # The heap of a Cutoffs holds the cutoffs themselves, ordered by the time each was
        # queued for (``_at``, fixed while it is queued; ``when`` may move later).
        return self._at < other._at

    def __init__(self, owner: Cutoffs, task: asyncio.Task[object], when: float) -> None:
        self._owner = owner
        self.when = when
        self._at = when
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._consumed = False
        self.closed = False
        self.cut_off = False
        """Whether the CancelledError that left the block was this cutoff's."""
        self.queued = True  # still in the heap of its Cutoffs

    def __enter__(self) -> Cutoff:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.leave(error)

    def leave(self, error: BaseException | None) -> None:
        """Leave the scope (what ``__exit__`` does), ``error`` propagating out of it: judge
        whether a CancelledError is ours (:attr:`cut_off`), then close.  For a scope written
        as ``try``/``except``/``else`` where a ``with`` would hold a bound ``__exit__`` for
        as long as the block awaits (64 bytes per call in flight)."""
        if error is not None and isinstance(error, asyncio.CancelledError):
            self.cut_off = self.fired()
        self.close()

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

    def finish(self) -> bool:
        """Close the scope of work that returned, and say whether the task was asked to
        cancel by someone else meanwhile (:meth:`cancelled_elsewhere`)."""
        self.close()
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
            # Counted here, not by a call into the owner: every call closes one or two.
            owner = self._owner
            closed = owner.closed_in_heap = owner.closed_in_heap + 1
            if closed >= _COMPACT_AT and closed * 2 > len(owner._heap):
                owner._compact()

    def reopen(self, when: float, *, shared: bool = False) -> Cutoff:
        """Once closed, a cutoff of the same task at ``when``: what ``cutoffs.at(when)``
        gives, for less — this cutoff opened again when it is still queued for no later
        than ``when`` (its heap entry serves: queued early, it is queued again for ``when``
        as a postponed one is), else a new one.  For a scope that follows this one in the
        same task and ends later (the completion write after the callback, bounded at the
        lease end); always a new one when this cutoff is ``shared`` (something else holds
        it, and may close it)."""
        if shared or not self.queued or self._at > when:
            return self._owner.at(when)
        self._owner.closed_in_heap -= 1
        self.when = when
        self._cancelling = self._task.cancelling()
        self._expired = self._consumed = self.closed = self.cut_off = False
        return self


class InsistingCutoff(Cutoff):
    """A cutoff that cancels its task a second time, at the next turn of the loop, if the
    work it cut off is still unwinding then: psycopg answers a cancellation by asking its
    server to cancel the statement and waiting for the answer, and closes the connection
    instead on a second one.  For work to abandon, not to wait for (a lease renewal whose
    answer is late)."""

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
        # The cutoffs themselves, by the time each is queued for: no (when, cutoff) tuple,
        # which would be one more object per call in flight.  A postponed cutoff stays where
        # it is and is queued again for its new time when it surfaces.
        self._heap: list[Cutoff] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        self.closed_in_heap = 0
        """Closed cutoffs still in the heap (counted by :meth:`Cutoff.close`)."""

    def at(self, when: float) -> Cutoff:
        """Cancel the current task at ``when`` (loop time) unless the cutoff is closed first
        (a scope: ``with cutoffs.at(when) as cutoff:``)."""
        task = _task_of(self.loop)
        if task is None:
            raise RuntimeError("a cutoff must be started inside a task")
        cutoff = Cutoff(self, task, when)
        heapq.heappush(self._heap, cutoff)
        if when < self._armed_at:
            self._arm(when)
        return cutoff

    def insist(self, when: float) -> InsistingCutoff:
        """As :meth:`at`, with a cutoff that cancels twice (:class:`InsistingCutoff`).
        Separate from :meth:`at`, which every call takes: no branch added there."""
        task = _task_of(self.loop)
        if task is None:
            raise RuntimeError("a cutoff must be started inside a task")
        cutoff = InsistingCutoff(self, task, when)
        heapq.heappush(self._heap, cutoff)
        if when < self._armed_at:
            self._arm(when)
        return cutoff

    def postpone(self, cutoff: Cutoff, when: float) -> None:
        """Move an open cutoff later, to ``when`` (a renewed lease).  It stays queued for
        its earlier time; when that comes, it is queued again for ``when``."""
        if cutoff.closed or cutoff.expired or when <= cutoff.when:
            return
        cutoff.when = when

    def _compact(self) -> None:
        """Rebuild the heap without its closed cutoffs (once they are half of it)."""
        for cutoff in self._heap:
            cutoff.queued = not cutoff.closed
        self._heap = [cutoff for cutoff in self._heap if cutoff.queued]
        heapq.heapify(self._heap)
        self.closed_in_heap = 0

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
        while heap and (heap[0]._at <= now or heap[0].closed):
            cutoff = heapq.heappop(heap)
            if cutoff.closed:
                cutoff.queued = False
                self.closed_in_heap -= 1
            elif cutoff.when > now:  # postponed: queued again for its new time
                cutoff._at = cutoff.when
                heapq.heappush(heap, cutoff)
            else:
                cutoff.queued = False
                cutoff.expire()
        if heap:
            self._arm(heap[0]._at)
