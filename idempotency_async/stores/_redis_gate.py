"""The Redis store's queue for its client's connection pool.

redis-py's default pool raises ``MaxConnectionsError`` on the command that finds every
connection in use, so the store sends at most as many commands at once as the pool holds
and queues the others (:func:`~idempotency_async.stores.redis._pool_limit`).  A gate is
taken on every command: it is an ``asyncio.Semaphore`` reduced to what the store needs, so
that taking a free slot is two integer operations and no coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

__all__ = ["Gate"]


class Gate:
    """At most ``size`` of the store's commands in flight, the others waiting their turn
    in order: what an ``asyncio.Semaphore`` does, for two integer operations when a
    connection is free (it is taken on every command).  A slot freed while commands wait
    is handed to the first of them; a waiter cancelled after it was handed one passes it on.
    """

    __slots__ = ("free", "waiters")

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def wait(self) -> None:
        """Wait for a slot (called when none is free); it is held on return."""
        turn = asyncio.get_running_loop().create_future()
        self.waiters.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.release()  # handed a slot, but cancelled before it could run
            else:
                with contextlib.suppress(ValueError):  # or release() skipped it already
                    self.waiters.remove(turn)
            raise

    def release(self) -> None:
        waiters = self.waiters
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: free is unchanged
                return
        self.free += 1

    async def __aenter__(self) -> None:
        if self.free > 0:
            self.free -= 1
        else:
            await self.wait()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
