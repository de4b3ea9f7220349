"""Calls that complete before they end: :meth:`Manager.execute_call` and its :class:`Call`.

Some work knows its answer before it has finished: an HTTP endpoint whose response has
started (the rest is sending it, and background tasks), a job that answers and then
notifies.  The point where the answer is known is the point of no return: the record is
completed there, the cutoff ends, and nothing the callback does afterwards can release the
key.  Kept apart from ``Manager._own`` so the plain path pays nothing for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from idempotency_async._callback import (
    ReturnedNotAwaitable,
    awaitable,
    not_awaitable_error,
    not_awaitable_reason,
)
from idempotency_async._cutoff import Cutoff
from idempotency_async._downstream import Run
from idempotency_async._flight import Flight
from idempotency_async.errors import CompletionError, ConfigError
from idempotency_async.record import Completion
from idempotency_async.stores.base import Written

if TYPE_CHECKING:
    from idempotency_async.manager import Manager, _Lease

__all__ = ["Call", "Unprotected", "own_call"]

T = TypeVar("T")


class Call:
    """The handle an :meth:`~idempotency_async.Manager.execute_call` callback receives.

    ``complete(result)`` or ``complete_without_response(reason)`` completes the record at
    once, while the callback goes on: from then on the cutoff no longer applies, and an
    exception or cancellation of the callback no longer releases the key (it propagates,
    the record stays completed).  A record completed without a response may be completed
    once more, by this call only (the write is fenced by its owner token), e.g. to attach a
    response captured after the answer went out; one completed with a response is final.
    """

    __slots__ = (
        "_cutoff",
        "_flight",
        "_lease",
        "_loop",
        "_manager",
        "_started",
        "answered",
        "stored",
    )

    def __init__(
        self,
        manager: Manager,
        flight: Flight,
        lease: _Lease,
        loop: asyncio.AbstractEventLoop,
        cutoff: Cutoff,
    ) -> None:
        self._manager = manager
        self._flight = flight
        self._lease = lease
        self._loop = loop
        self._cutoff = cutoff
        self._started = loop.time()
        self.answered = False
        """Whether a completion was attempted (the key is never released after that)."""
        self.stored = False
        """Whether the record holds a response (no further completion is allowed)."""

    @property
    def key(self) -> str:
        return self._flight.keys.key

    async def complete(self, result: Any) -> None:
        """Complete the record with ``result`` now (encoded as ``execute`` would store it).

        Raises :class:`~idempotency_async.errors.LeaseLostError` or
        :class:`~idempotency_async.errors.CompletionError` as ``execute`` does; the key is
        not released either way.
        """
        manager = self._manager
        completion = manager._completion_for(self._lease.claim, result)
        await self._write(completion, result)

    async def complete_without_response(self, reason: str) -> None:
        """Complete the record now without a response; duplicates get
        :class:`~idempotency_async.errors.ResponseNotStoredError` naming ``reason``."""
        if not isinstance(reason, str) or not reason:
            raise ConfigError("complete_without_response needs the reason as a non-empty str")
        manager = self._manager
        claim = self._lease.claim
        completion = Completion(
            claim.key,
            claim.owner,
            manager.options.clock(),
            manager.options.expires_after,
            claim.validation,
            None,
            None,
            reason[:300],
        )
        await self._write(completion, None)

    async def _write(self, completion: Completion, result: Any) -> None:
        if self.stored:
            raise ConfigError(
                f"key {self.key} was already completed with a response: one key, one answer"
            )
        cutoff = self._cutoff
        if not self.answered:
            if cutoff.expired and not cutoff.closed:
                # The cutoff already cancelled the callback's task, which is still running
                # under it: it ends with DeadlineExceededError, and nothing may be written
                # after that.  (Closed: the callback returned, having ignored the cutoff;
                # its result is recorded as execute records it, fenced by its owner.)
                raise asyncio.CancelledError
            cutoff.close()  # from here on the callback runs outside the cutoff
        self.answered = True
        manager, lease, loop = self._manager, self._lease, self._loop
        key = completion.key
        sent = loop.time()
        written = await manager._write_completion(lease, completion, result, loop)
        flight = self._flight
        # Duplicates of this process go to the store (or the cache) from now on: the key
        # is completed, so they must replay, never hear "in progress".
        if manager._inflight.get(key) is flight:
            del manager._inflight[key]
        manager._completed(completion, written, result, flight, loop.time() - self._started, sent)
        flight.settle(None)
        self.stored = written is Written.RESPONSE  # what the store kept, not what was sent


class Unprotected(Call):
    """The handle of a call run without idempotency (no key): completing writes nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        self.answered = False
        self.stored = False

    @property
    def key(self) -> str:
        return ""

    async def _write(self, completion: Completion | None, result: Any) -> None:
        self.answered = True

    async def complete(self, result: Any) -> None:
        await self._write(None, result)

    async def complete_without_response(self, reason: str) -> None:
        await self._write(None, None)


async def own_call(
    manager: Manager,
    flight: Flight,
    callback: Callable[[Call], Awaitable[T]],
    loop: asyncio.AbstractEventLoop,
) -> T:
    """``Manager._own`` for a callback that may complete the record before it returns."""
    from idempotency_async.manager import _Replayed

    key = flight.keys.key
    manager._inflight[key] = flight
    try:
        acquired = await manager._acquire(flight, loop)
        if isinstance(acquired, _Replayed):
            return acquired.value  # type: ignore[no-any-return]
        lease = acquired
        call = Call(manager, flight, lease, loop, manager._cutoffs_of(loop).start(lease.cutoff_at))
        run = Run(key)  # what downstream keys see while the callback runs
        try:
            try:
                pending = callback(call)
                if not hasattr(pending, "__await__"):
                    pending = awaitable(pending)  # a plain function: it has run already
                result = await pending
            finally:
                run.end()
        except asyncio.CancelledError as exc:
            cut_off = call._cutoff.fired()
            call._cutoff.close()
            if cut_off and not call.answered:
                manager._emit("cut_off", key)
                raise _cut_off(key) from exc
            if cut_off or call.answered or call._cutoff.cancelled_elsewhere():
                raise  # the caller was cancelled (or the key is completed): no store write
            # A CancelledError the callback raised on its own is its own exception.
            await manager._release_after_failure(lease, exc, loop)
            raise
        except ReturnedNotAwaitable as returned:
            call._cutoff.close()
            # It ran and cannot be undone: complete without a response, never release.
            error = not_awaitable_error(returned.value, key)
            if not call.answered:
                manager._emit("response_not_stored", key, error=error)
                try:
                    await call.complete_without_response(not_awaitable_reason(returned.value))
                except CompletionError as failed:
                    raise error from failed
            raise error from None
        except Exception as exc:
            call._cutoff.close()
            if call._cutoff.cancelled_elsewhere():
                raise asyncio.CancelledError from exc  # no store write after a cancellation
            if not call.answered:
                await manager._release_after_failure(lease, exc, loop)
            raise
        except BaseException:
            # Like a crash: no store write, the record waits for its lease; the cutoff
            # must not outlive the callback and cancel the caller later.
            call._cutoff.close()
            raise
        call._cutoff.close()
        if call._cutoff.cancelled_elsewhere():
            raise asyncio.CancelledError  # swallowed by the callback: no store write after it
        if not call.answered:
            await call.complete(result)
        return result
    finally:
        if manager._inflight.get(key) is flight:
            del manager._inflight[key]
        flight.settle(None)


def _cut_off(key: str) -> Exception:
    from idempotency_async.manager import _cut_off as cut_off

    return cut_off(key)
