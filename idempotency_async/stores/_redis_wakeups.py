"""Wake-ups for the duplicates waiting on a Redis store: one pub/sub connection per store,
fanned out in-process to every waiter on a key.

The completion and release scripts publish on the channel named like the record's Redis
key (:mod:`idempotency_async.stores._redis_scripts`).  A store's :class:`Wakeups`
subscribes to a key's channel while at least one of its waiters watches the key and
unsubscribes when the last one leaves.  All pub/sub I/O runs in one task the store owns:
started by the first watch, ended by the store's ``aclose()``; a waiter only registers and
unregisters in memory, so a cancelled waiter sends nothing.

A waiter is woken by a message on its channel and whenever messages may have been missed:
the connection was lost (until it is back, waiters poll at the usual pace), or the channel
was confirmed again after redis-py reconnected on its own.  It re-reads the record each
time; nothing here decides anything, and a lost message means waiting for the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any, Final

__all__ = ["Wakeups", "sleeping"]

logger = logging.getLogger("idempotency_async.redis")

_FIRST_RETRY: Final = 0.1
_MAX_RETRY: Final = 5.0
# A connection that served this long before failing starts the retries afresh.
_STABLE: Final = 30.0


class _Watch:
    """One waiter's registration on one channel; a ``with`` block."""

    __slots__ = ("_event", "_wakeups", "channel")

    def __init__(self, wakeups: Wakeups, channel: str) -> None:
        self._wakeups = wakeups
        self.channel = channel
        self._event = asyncio.Event()

    @property
    def listening(self) -> bool:
        return self.channel in self._wakeups.live

    async def wait(self, timeout: float) -> None:
        event = self._event
        if not event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await event.wait()
        event.clear()

    def wake(self) -> None:
        self._event.set()

    def __enter__(self) -> _Watch:
        self._wakeups.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._wakeups.remove(self)


class _Sleep:
    """No wake-ups (the store is closed, or used from another event loop): sleep."""

    __slots__ = ()
    listening = False

    async def wait(self, timeout: float) -> None:
        await asyncio.sleep(timeout)

    def __enter__(self) -> _Sleep:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def sleeping() -> _Sleep:
    """A watch that is never woken: its waiter polls."""
    return _Sleep()


class Wakeups:
    """The pub/sub subscription of one store and the waiters it wakes."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._watches: dict[str, set[_Watch]] = {}
        self._requested: set[str] = set()  # SUBSCRIBE sent on the current connection
        self.live: set[str] = set()
        """Channels whose subscription the server confirmed (and not lost since)."""
        self._task: asyncio.Task[None] | None = None
        self._poke: asyncio.Future[None] | None = None
        self._closed = False

    def watch(self, channel: str) -> _Watch | _Sleep:
        task = self._task
        if self._closed or (task is not None and task.get_loop() is not asyncio.get_running_loop()):
            return _Sleep()
        return _Watch(self, channel)

    def add(self, watch: _Watch) -> None:
        watches = self._watches.get(watch.channel)
        if watches is None:
            watches = self._watches[watch.channel] = set()
            self._changed()
        watches.add(watch)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="idempotency-async redis wake-ups"
            )

    def remove(self, watch: _Watch) -> None:
        watches = self._watches.get(watch.channel)
        if watches is None:
            return
        watches.discard(watch)
        if not watches:
            del self._watches[watch.channel]
            self._changed()

    async def aclose(self) -> None:
        """Stop the subscription task and close its connection; watches made afterwards
        only sleep."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            # Told twice (see _stopped).
            self._changed()
            task.cancel()
            await asyncio.wait({task})

    # -- the subscription task ------------------------------------------------------

    def _stopped(self) -> bool:
        # Asked on every turn: redis-py may swallow a cancellation that lands while it sends.
        return self._closed

    def _changed(self) -> None:
        poke = self._poke
        if poke is not None and not poke.done():
            poke.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pause = _FIRST_RETRY
        while not self._stopped():
            started = loop.time()
            try:
                await self._serve(loop)
            except Exception as exc:
                # (The type only: a message may carry the server's address.)
                logger.info(
                    "the pub/sub connection waking waiters failed (%s): they poll until it is back",
                    type(exc).__name__,
                )
            finally:
                self._lost()
            if self._stopped():
                return
            if loop.time() - started > _STABLE:
                pause = _FIRST_RETRY
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_RETRY)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Subscribe to the watched channels and dispatch what arrives, until the
        connection fails (raises) or the task is cancelled."""
        pubsub = self._client.pubsub()
        reading: asyncio.Task[Any] | None = None
        try:
            while not self._stopped():
                poke = self._poke = loop.create_future()
                await self._sync(pubsub)
                if reading is None and pubsub.connection is not None:
                    # One read outstanding at a time, never cancelled while the connection
                    # is in use: SUBSCRIBE and UNSUBSCRIBE are sent beside it.
                    reading = loop.create_task(pubsub.get_message(timeout=None))
                waits: set[asyncio.Future[Any]] = {poke} if reading is None else {poke, reading}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if reading is not None and reading.done():
                    message, reading = reading.result(), None
                    self._dispatch(message)
        finally:
            self._poke = None
            if reading is not None:
                reading.cancel()
                await asyncio.wait({reading})
                if not reading.cancelled():
                    reading.exception()  # retrieved: the connection is closed below anyway
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def _sync(self, pubsub: Any) -> None:
        """Send SUBSCRIBE for newly watched channels and UNSUBSCRIBE for abandoned ones."""
        new = [channel for channel in self._watches if channel not in self._requested]
        old = [channel for channel in self._requested if channel not in self._watches]
        if new:
            self._requested.update(new)
            await pubsub.subscribe(*new)
        if old:
            self._requested.difference_update(old)
            self.live.difference_update(old)
            await pubsub.unsubscribe(*old)

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        kind, channel = message.get("type"), message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if not isinstance(channel, str):
            return
        if kind == "subscribe":
            if channel not in self._requested:
                return
            if channel not in self.live:
                self.live.add(channel)
                return
            # Confirmed again: redis-py reconnected and subscribed again by itself, and
            # messages sent meanwhile were lost.
        elif kind == "unsubscribe":
            self.live.discard(channel)
            return
        elif kind != "message":
            return
        for watch in self._watches.get(channel, ()):
            watch.wake()

    def _lost(self) -> None:
        """The connection is gone: messages may have been missed; wake every waiter."""
        self._requested.clear()
        self.live.clear()
        for watches in self._watches.values():
            for watch in watches:
                watch.wake()
