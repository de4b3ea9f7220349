"""Waiting on another call's claim: in this process (a duplicate joins the call that claims
or holds its key) and across processes (reads of an in-progress record with backoff),
bounded by ``Options.wait`` (its ``timeout``) and the caller's deadline — woken early by stores that
can (:class:`~idempotency_async.stores.base.Wakes`: Redis pub/sub); and refusing with
:class:`~idempotency_async.errors.AlreadyInProgressError` when waiting is off or over.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

from idempotency_async._emission import Emitter
from idempotency_async._flight import Flight, Outcome, Phase, wait_for
from idempotency_async._keys import KeyDeriver, Keys
from idempotency_async.errors import (
    AlreadyInProgressError,
    DeadlineExceededError,
    InconsistentStateError,
    StoreUnavailableError,
)
from idempotency_async.options import Options
from idempotency_async.stores.base import Found, Store, Verdict, Wakes, Watch, check_key

__all__ = ["UNANSWERED", "Unanswered", "Waiting"]

_FIRST_POLL = 0.05
_MAX_POLL = 1.0
# While the store would wake the waiter, polls are only the safety net (a lost message, a
# writer that does not publish): 1 s, doubling to 4 s, and never past the holder's lease end.
_LISTENING_POLL = 1.0
_MAX_LISTENING_POLL = 4.0


class Unanswered:
    """Another call's claim stayed unanswered for as long as a duplicate may wait."""


UNANSWERED = Unanswered()


class _Sleep:
    """A store without wake-ups: a waiter sleeps until its next poll."""

    __slots__ = ()
    listening = False

    async def wait(self, timeout: float) -> None:
        await asyncio.sleep(timeout)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_SLEEP = _Sleep()


class Waiting:
    """How the calls of one manager wait for other holders of their key, or refuse."""

    def __init__(self, options: Options, keys: KeyDeriver, emitter: Emitter) -> None:
        self._options = options
        self._keys = keys
        self._emitter = emitter

    async def poll(
        self,
        store: Store,
        keys: Keys,
        verdict: Verdict,
        wait_until: float,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[Verdict, float]:
        """Read an in-progress record with bounded backoff until the store judges it
        completed or claimable; returns that verdict and when its read was sent.  Reads, not
        claim attempts: in DynamoDB a refused conditional write costs write capacity, a
        strongly consistent read a fifth of it.  A store that wakes waiters (:class:`Wakes`)
        makes a read follow a completion or release at once, and polls rarer."""
        started = loop.time()
        try:
            # Refusing at once (waiting off) watches nothing: no subscription for a refusal.
            waits = self._options.wait is not None
            with store.watch(keys.key) if waits and isinstance(store, Wakes) else _SLEEP as watch:
                return await self._poll(store, keys, verdict, wait_until, loop, watch, started)
        finally:
            self._emitter.waited(loop.time() - started)

    async def _poll(
        self,
        store: Store,
        keys: Keys,
        verdict: Verdict,
        wait_until: float,
        loop: asyncio.AbstractEventLoop,
        watch: Watch,
        sent: float,
    ) -> tuple[Verdict, float]:
        """The reads of :meth:`poll`, each after a pause ``watch`` may end early; ``sent``
        is when the read behind ``verdict`` was sent (its ``retry_after`` counts from it)."""
        delay = _FIRST_POLL
        bounded = getattr(store, "reads_bounded", False)
        while True:
            left = wait_until - loop.time()
            if self._options.wait is None or left <= 0:
                self.refuse(keys.key, verdict.retry_after)
            pause = min(delay, left)
            if watch.listening and verdict.retry_after is not None:
                # Not past the holder's lease end (+ a first poll), by the store's count.
                pause = min(pause, max(sent + verdict.retry_after - loop.time(), 0) + _FIRST_POLL)
            await watch.wait(pause)
            if watch.listening:
                # The first poll closed the race with the subscription; the rest are the
                # safety net.
                delay = min(max(delay * 2, _LISTENING_POLL), _MAX_LISTENING_POLL)
            else:
                delay = min(delay * 2, _MAX_POLL)
            sent = loop.time()
            # Bounded like the wait: a read stuck behind a lock (a migration's) ends the
            # wait, not the call's deadline — by the store itself when its reads say so
            # (a cancellation there could hurt its transaction).
            bound = asyncio.timeout_at(None if bounded else wait_until)
            try:
                async with bound:
                    verdict = await store.get(keys.key, now=self._options.clock())
                if verdict.__class__ is Verdict:
                    check_key(verdict, keys.key)
            except InconsistentStateError as exc:
                self._emitter.emit("record_unreadable", keys.key, error=exc)
                raise
            except TimeoutError:
                # (Asked, not judged by the clock: the loop runs a timer up to its clock
                # resolution early.)
                if not bound.expired():
                    raise  # the store's own timeout, not the wait's end
                self.refuse(keys.key, verdict.retry_after)
            if verdict.__class__ is not Verdict:
                raise StoreUnavailableError(
                    f"the store answered a read of key {keys.key} with {verdict!r}, not a verdict"
                )
            if verdict.found is not Found.IN_PROGRESS:
                return verdict, sent
            if verdict.record is not None:
                self._keys.validate(verdict.record.validation, keys)

    def limit(self, deadline: float | None, loop: asyncio.AbstractEventLoop) -> float:
        """Until when (loop time) a call may wait: ``Wait.timeout`` from now (now, with
        waiting off), or its deadline if earlier."""
        limit = loop.time() + self._timeout()
        return limit if deadline is None else min(limit, deadline)

    def lock_wait(self, cutoff_at: float, loop: asyncio.AbstractEventLoop) -> float:
        """How long (seconds) a transactional claim may wait for a row another transaction
        holds: ``Wait.timeout``, but not past the call's cutoff; none with ``wait=None``."""
        if self._options.wait is None:
            return 0.0
        return max(min(self._timeout(), cutoff_at - loop.time()), 0.0)

    def _timeout(self) -> float:
        wait = self._options.wait
        return 0.0 if wait is None else wait.timeout

    def refuse(self, key: str, retry_after: float | None) -> NoReturn:
        self._emitter.emit("rejected_in_progress", key)
        raise AlreadyInProgressError(
            f"key {key} is being processed by another call: retry after its lease ends, or "
            "set Options(wait=Wait(timeout=...)) to wait for its result",
            key=key,
            lease_end=None if retry_after is None else self._options.clock() + retry_after,
            retry_after=retry_after,
        )

    async def join(
        self, flight: Flight, keys: Keys, deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> Outcome | Unanswered | None:
        """A call for a key another call of this process claims or holds.

        Returns the outcome to replay, None to look again (the other call failed), or
        ``UNANSWERED`` when the other call's claim stayed unanswered as long as this one
        may wait.
        """
        if flight.phase is Phase.CLAIMING:
            # Its claim is unanswered, and may turn out to be a replay: wait for the answer.
            waits = flight.waited_on()
            if waits.claim_answered is None:
                waits.claim_answered = loop.create_future()
            if not await self._wait_on(flight, waits.claim_answered, keys, deadline, loop):
                return UNANSWERED
            if not flight.holding():
                return flight.result
        self._keys.validate(flight.keys.validation, keys)
        if self._options.wait is None:
            # The lease as renewed so far (the holder's), not the one its claim wrote.
            lease_end = flight.lease_end
            retry_after = None
            if lease_end is not None:
                retry_after = max(lease_end - self._options.clock(), 0.0)
            self.refuse(keys.key, retry_after)
        waits = flight.waited_on()
        if waits.finished is None:
            waits.finished = loop.create_future()
        await self._wait_on(flight, waits.finished, keys, deadline, loop)
        return flight.result

    async def _wait_on(
        self,
        flight: Flight,
        future: asyncio.Future[Any],
        keys: Keys,
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """Wait for ``future`` at most min(``Wait.timeout``, own deadline) — own deadline only
        while the other call's claim is unanswered and waiting is off.  False when it did
        not resolve and the other call's claim is still unanswered."""
        if self._options.wait is not None or flight.holding():
            limit = self.limit(deadline, loop)
        else:
            limit = float("inf") if deadline is None else deadline
        key = keys.key
        waits = flight.waited_on()
        waits.count += 1
        started = loop.time()
        try:
            await wait_for(future, limit)
        except TimeoutError:
            # The limit that ran out, not the clock: the loop runs a timer up to its clock
            # resolution early.
            if deadline is not None and limit >= deadline:
                raise DeadlineExceededError(
                    f"the deadline of key {key} passed while waiting for another call of this "
                    "process holding it",
                    key=key,
                ) from None
            if not flight.holding():
                return False
            # Held by now (its claim answered as the wait ran out): a duplicate with another
            # payload learns that before it is told to retry (G5).
            self._keys.validate(flight.keys.validation, keys)
            lease_end = flight.lease_end
            retry_after = None
            if lease_end is not None:
                retry_after = max(lease_end - self._options.clock(), 0.0)
            self._emitter.emit("rejected_in_progress", key)
            raise AlreadyInProgressError(
                f"key {key} was still in progress after waiting {self._timeout()} s",
                key=key,
                lease_end=lease_end,
                retry_after=retry_after,
            ) from None
        finally:
            waits.count -= 1
            self._emitter.waited(loop.time() - started)
        return True
