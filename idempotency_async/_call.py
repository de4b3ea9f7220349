"""The handle an ``execute_call`` callback receives: :class:`Call`; an ``execute`` callback
receives none (:data:`NO_HANDLE`).  Both are a :class:`Handle`, the lifecycle's one view of
the callback's side of a call, chosen once per call: it never asks which it has.

A ``Call`` completes the record while the callback goes on (its point of no return), or asks for
the key back (:meth:`Call.release`).  The writes themselves are the lifecycle's
(:class:`Recorder`): the handle only knows its call — the single-flight entry, whose lease
is the call's one lease as renewed — and its cutoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

from idempotency_async._cutoff import Cutoff
from idempotency_async._endings import Answer
from idempotency_async._flight import Flight
from idempotency_async._lease import Lease
from idempotency_async._renewal import Renewing
from idempotency_async._steps import run_step
from idempotency_async.errors import ConfigError
from idempotency_async.record import Completion
from idempotency_async.stores.base import Written

__all__ = ["NO_HANDLE", "Call", "Handle", "Recorder", "Unprotected"]

T = TypeVar("T")

_NONE, _COMPLETED, _RELEASE = Answer.NONE, Answer.COMPLETED, Answer.RELEASE


class Handle(Protocol):
    """The callback's side of a call, as the lifecycle sees it."""

    @property
    def args(self) -> tuple[Any, ...]:
        """What the callback is called with: the handle, or nothing."""

    @property
    def said(self) -> Answer:
        """What the callback said through its handle (for the decision table)."""

    @property
    def shares_cutoff(self) -> bool:
        """Whether the handle holds the work's cutoff too (and may close it)."""


class _NoHandle:
    """An ``execute`` callback's side: it is called without arguments and says nothing."""

    # Instance slots, not class attributes: Python 3.11 specialises reading a slot, not
    # reading a class attribute through an instance (every call reads three of these).
    __slots__ = ("args", "said", "shares_cutoff")

    def __init__(self) -> None:
        self.args = ()
        self.said = _NONE
        self.shares_cutoff = False


NO_HANDLE: Final[Handle] = _NoHandle()


class Recorder(Protocol):
    """What a :class:`Call` writes through (the lifecycle)."""

    def completion_for(self, lease: Lease, result: Any) -> Completion: ...

    def completion_without_response(self, lease: Lease, reason: str | None) -> Completion: ...

    async def complete_held(
        self,
        flight: Flight,
        completion: Completion,
        result: Any,
        loop: asyncio.AbstractEventLoop,
        started: float,
        renewing: Renewing = ...,
    ) -> Written: ...


class Call:
    """The handle an :meth:`~idempotency_async.Manager.execute_call` callback receives.

    ``complete(result)`` or ``complete_without_response(reason)`` completes the record at
    once, while the callback goes on: from then on the cutoff no longer applies, and an
    exception or cancellation of the callback no longer releases the key (it propagates,
    the record stays completed).  A record completed without a response may be completed
    once more, by this call only (the write is fenced by its owner token), e.g. to attach a
    response captured after the answer went out; one completed with a response is final.

    ``release(reason)`` asks for the opposite: when the callback returns, the key is
    released (owner-fenced) instead of completed, and a retry runs the work again.
    """

    __slots__ = (
        "_cutoff",
        "_flight",
        "_loop",
        "_recorder",
        "_renewing",
        "_started",
        "answered",
        "released",
        "said",
        "stored",
    )

    shares_cutoff: Final = True  # it closes the cutoff at its point of no return

    def __init__(
        self,
        recorder: Recorder,
        flight: Flight,
        loop: asyncio.AbstractEventLoop,
        cutoff: Cutoff,
        renewing: Renewing,
    ) -> None:
        self._recorder = recorder
        self._flight = flight  # its lease is the call's, as renewed: read at each write
        self._loop = loop
        self._cutoff = cutoff
        self._renewing = renewing  # a renewal on its way may yet move the lease
        self._started = loop.time()
        self.answered = False
        """Whether a completion was attempted (the key is never released after that)."""
        self.stored = False
        """Whether the record holds a response (no further completion is allowed)."""
        self.released: str | None = None
        """The reason given to :meth:`release`, once the callback asked for it."""
        self.said = _NONE

    @property
    def args(self) -> tuple[Call]:
        # Made when read, not kept: a tuple holding the handle would be a reference cycle.
        return (self,)

    @property
    def key(self) -> str:
        return self._flight.keys.key

    async def complete(self, result: Any) -> None:
        """Complete the record with ``result`` now (encoded as ``execute`` would store it).

        Raises :class:`~idempotency_async.errors.LeaseLostError` or
        :class:`~idempotency_async.errors.CompletionError` as ``execute`` does; the key is
        not released either way.
        """
        await self._write(self._recorder.completion_for(self._lease(), result), result)

    async def complete_without_response(self, reason: str) -> None:
        """Complete the record now without a response; duplicates get
        :class:`~idempotency_async.errors.ResponseNotStoredError` naming ``reason``."""
        if not isinstance(reason, str) or not reason:
            raise ConfigError("complete_without_response needs the reason as a non-empty str")
        completion = self._recorder.completion_without_response(self._lease(), reason[:300])
        await self._write(completion, None)

    def release(self, reason: str) -> None:
        """Release the key when the callback returns, instead of completing the record: the
        work counts as not done (nothing is recorded, a retry runs it again) while its
        return value still goes to the caller.  For an answer that must not be replayed,
        such as a server error that went out as it was.

        Takes effect when the callback returns (an exception, a cutoff or a cancellation
        ends the call as it would anyway); until then the key stays held.  ``reason`` (a
        non-empty str) is kept as :attr:`released`.
        :class:`~idempotency_async.errors.ConfigError` once the call was completed: after
        its point of no return a key is never released.
        """
        if not isinstance(reason, str) or not reason:
            raise ConfigError("release needs the reason as a non-empty str")
        if self.answered:
            raise ConfigError(
                f"key {self.key} was already completed: after its point of no return a key "
                "is never released"
            )
        if self.released is None:
            self.released = reason[:300]
            self.said = _RELEASE

    def step(
        self, name: str, fn: Callable[[], Awaitable[T]], *, connection: Any = None
    ) -> Awaitable[T]:
        """:func:`~idempotency_async.step` of this call (the same thing, spelled on the
        handle)."""
        return run_step(name, fn, connection)

    def _lease(self) -> Lease:
        lease = self._flight.lease
        assert lease is not None  # a Call exists only for a held key
        return lease

    async def _write(self, completion: Completion, result: Any) -> None:
        if self.released is not None:
            raise ConfigError(
                f"key {self.key} is to be released ({self.released}): it cannot be completed"
            )
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
        self.said = _COMPLETED
        # Bounded by the lease as last renewed (renewal stops once the cutoff is closed).
        written = await self._recorder.complete_held(
            self._flight, completion, result, self._loop, self._started, self._renewing
        )
        self.stored = written is Written.RESPONSE  # what the store kept, not what was sent


class Unprotected(Call):
    """The handle of a call run without idempotency (no key): completing writes nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        self.answered = False
        self.stored = False
        self.released = None
        self.said = _NONE

    @property
    def key(self) -> str:
        return ""

    async def _write(self, completion: Completion | None, result: Any) -> None:
        self.answered = True
        self.said = _COMPLETED

    async def complete(self, result: Any) -> None:
        await self._write(None, result)

    async def complete_without_response(self, reason: str) -> None:
        await self._write(None, None)
