"""The lifecycle of one idempotent call.  There is one implementation, :meth:`Lifecycle.run`;
every entry point is a door into it (``Manager.execute`` runs a zero-argument callback,
``Manager.execute_call`` one that receives the :class:`~idempotency_async._call.Call`,
``Manager.execute_in_transaction`` runs it on :meth:`Lifecycle.in_transaction`).

``run`` is a spine of steps, each small and named:

1. **Answer early**: the local cache, then a call of this process claiming or holding the
   key (single flight, ``_waiting``).
2. **Claim**: one conditional write; the store answers CLAIMED or the record it met, which
   is replayed, waited on (``_contend``) or claimed again.
3. **Hold**: the key is in progress here; a claim answered after its cutoff is abandoned.
4. **Work**: the callback runs under ``cutoffs.at(lease.cutoff_at)`` — a scope left on
   every path (``try``/``except``/``else`` and :meth:`Cutoff.leave`: a ``with`` would hold
   a bound ``__exit__`` per call in flight) — with its lease renewed or not (``_renewal``).
5. **Decide**: how the callback ended, whether the cutoff fired, whether the caller was
   cancelled and what the callback said through its ``Call`` go to one pure table
   (``_endings.decide``) that answers what to write and what to raise.
6. **Settle**: the one completion write (bounded at the lease end, its failures mapped by
   one synchronous context manager, :class:`_Completing`), or a release, or nothing.

What varies is chosen once, as objects the spine calls without asking which they are: when
the lifecycle is built, the mode (``_modes``: plain, or in a caller's transaction) and the
leases (``_renewal``: fixed, or renewed); when the call is, the callback's handle
(``_call``: a ``Call`` for ``execute_call``, none for ``execute``).  The lease is one
object (``_lease.Lease``) that holds all lease arithmetic and that renewal, ``Call`` and
in-process duplicates all read.

The uncontended path — claim, callback, completion — awaits from the one frame of ``run``:
with thousands of calls in flight every live coroutine frame is memory and
garbage-collector work.  The steps it shares with the other paths are plain functions and
context managers, which cost no frame; the contended and failing paths have their own.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import types
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, NamedTuple, TypeVar

from idempotency_async._call import NO_HANDLE, Call, Handle
from idempotency_async._callback import (
    ReturnedNotAwaitable,
    awaitable,
    not_awaitable_error,
    not_awaitable_reason,
)
from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._endings import COMPLETE, Decision, Ended, Outcome, Write, decide
from idempotency_async._flight import Flight
from idempotency_async._keys import KeyDeriver, Keys
from idempotency_async._lease import Deadline, Lease
from idempotency_async._modes import InTransaction, Mode, Plain, TransactionalStore
from idempotency_async._renewal import NOT_RENEWING, Renewing
from idempotency_async._replayed import encode_error
from idempotency_async._responses import (
    Replays,
    log_not_stored,
    not_stored_error,
    not_stored_reason,
)
from idempotency_async._steps import UNPROTECTED, Progress, Stepper
from idempotency_async._waiting import UNANSWERED, Waiting
from idempotency_async.errors import (
    AlreadyInProgressError,
    CompletionError,
    DeadlineExceededError,
    InconsistentStateError,
    LeaseLostError,
    PayloadValidationError,
    ResponseNotStoredError,
    StoreAccessDeniedError,
    StoreUnavailableError,
    StoreValidationError,
    TransactionRetryError,
)
from idempotency_async.options import Options
from idempotency_async.record import Completion, Record
from idempotency_async.stores.base import (
    CLAIMED,
    Found,
    RecordsSteps,
    Store,
    Verdict,
    Written,
    check_key,
)

__all__ = ["Lifecycle", "TransactionalStore"]

T = TypeVar("T")
_Callback = Callable[..., Awaitable[T]]
_Loop = asyncio.AbstractEventLoop

_CLAIM_RETRIES = 2
# Store errors that refuse a claim outright (the request, or the record it met, cannot be
# processed): nothing was written.  Any other failure may hide a claim that applied.
_REFUSALS = (StoreAccessDeniedError, StoreValidationError)

_COMPLETED = Found.COMPLETED  # a global reads faster than an Enum member (Python 3.11)
_COROUTINE = types.CoroutineType  # what most callbacks return: no attribute lookup for it
_NOTHING, _RESPONSE, _WITHOUT_RESPONSE = Written.NOTHING, Written.RESPONSE, Written.WITHOUT_RESPONSE
_RETURNED = Ended.RETURNED
# ``Completion(...)`` runs a Python-level ``__new__``; the tuple constructor, called as it
# is (a ``partial`` costs a fifth more), does not: every first call builds one.  Every field
# is passed, in the order ``Completion`` declares them.
_tuple_new: Final = tuple.__new__


_CLAIM: Final = object()
"""What ``Lifecycle._join`` answers when the call is to claim the key itself."""


class _Replay(NamedTuple):
    """A claim that found the key completed: the value to return instead of running."""

    value: Any


class _Shared:
    """What a lifecycle and its transactional views share: owner tokens and cutoffs."""

    __slots__ = ("_claims", "_cutoffs", "_prefix")

    def __init__(self) -> None:
        # Owner tokens: random per manager (96 bits, as 16 base64url characters), unique
        # per claim, cheap to make, and short: every call in flight holds one.
        self._prefix = secrets.token_urlsafe(12) + "-"
        self._claims = itertools.count()
        self._cutoffs: Cutoffs | None = None

    def owner(self) -> str:
        return self._prefix + str(next(self._claims))  # (cheaper than an f-string)

    def cutoffs(self, loop: asyncio.AbstractEventLoop) -> Cutoffs:
        cutoffs = self._cutoffs
        if cutoffs is None or cutoffs.loop is not loop:
            cutoffs = self._cutoffs = Cutoffs(loop)
        return cutoffs


class Lifecycle:
    """The one implementation of an idempotent call, for one manager.

    Holds what a call needs — the mode (the store round trips go to, and what may learn
    a result), the single-flight table, the local cache, the cutoffs — and nothing of the
    manager that wires it.
    """

    def __init__(
        self,
        store: Store,
        options: Options,
        keys: KeyDeriver,
        emitter: Emitter,
        *,
        mode: Mode | None = None,
        shared: _Shared | None = None,
        waiting: Waiting | None = None,
        records_steps: bool | None = None,
    ) -> None:
        self.options = options
        self.keys = keys
        self.emitter = emitter
        self.emit = emitter.emit  # bound once: the plain path emits twice per call
        self.waiting = waiting if waiting is not None else Waiting(options, keys, emitter)
        if mode is None:
            mode = Plain(store, options, keys, emitter, Replays(options, keys, emitter))
        self.mode = mode
        self.store = mode.store
        """Where round trips go (a timing wrapper when the manager has telemetry)."""
        self.replays = mode.replays
        declared = self.replays.responses.declared
        self._declared = () if declared is None else declared.classes
        """Exception classes the callback's caller declared results (``replay_errors``)."""
        self.inflight: dict[str, Flight] = {}
        if records_steps is None:
            records_steps = isinstance(store, RecordsSteps)
        self.stepper = Stepper(
            self.store, options, emitter, capable=records_steps, records=self.mode.records_steps
        )
        """Records the steps of this lifecycle's calls (``_steps``)."""
        self._shared = shared if shared is not None else _Shared()
        self._uncached: Replays | None = None

    def in_transaction(self, store: TransactionalStore) -> Lifecycle:
        """A lifecycle for one transactional call on ``store``: its own (empty) in-flight
        table, no local cache, its leases fixed (see ``_modes.InTransaction``)."""
        if self._uncached is None:
            self._uncached = Replays(self.options, self.keys, self.emitter)
            self._uncached.cache = None
        mode = InTransaction(store, self.waiting, self.emitter, self._uncached)
        view = Lifecycle(
            store,
            self.options,
            self.keys,
            self.emitter,
            mode=mode,
            shared=self._shared,
            waiting=self.waiting,
            records_steps=False,
        )
        # A declared error rolls the savepoint back like any other: what the callback
        # wrote before raising must not commit as its result (docs/manager.md).
        view._declared = ()
        return view

    # ------------------------------------------------------------------ the spine

    async def run(
        self, keys: Keys, deadline: Deadline, callback: _Callback[T], loop: _Loop, held: bool
    ) -> T:
        """Replay, join, or claim the key and run ``callback`` — ``callback(call)`` when
        ``held``, ``callback()`` otherwise — then complete or release the record."""
        # 1. Answer early.  (Few locals: each is memory while the call is in flight.)
        early: Any
        if self.replays.cache is not None:
            early = self.replays.cache.get(keys.key, loop.time())
            if early is not None:
                return self.replays.hit(early, keys)  # type: ignore[no-any-return]
        if keys.key in self.inflight:
            early = await self._join(keys, deadline, loop)
            if early is not _CLAIM:
                return early  # type: ignore[no-any-return]
        flight = self.inflight[keys.key] = Flight(keys, self._shared.owner(), self.stepper)
        renewing, handle = NOT_RENEWING, NO_HANDLE
        try:
            # 2. Claim: the common replay is answered here, any other answer by _contend.
            lease = self._lease(flight, deadline, loop)
            try:
                verdict = await self.mode.claim(lease, loop)
            except Exception as exc:
                await self._claim_failed(lease, exc, loop)
                raise
            if verdict is not CLAIMED:
                if _replayable(verdict, keys.key):
                    return self.replays.record(verdict, flight)  # type: ignore[no-any-return]
                early = await self._contend(flight, lease, verdict, deadline, loop)
                if early.__class__ is _Replay:
                    return early.value  # type: ignore[no-any-return]
                lease = early
            # 3. Hold (a claim answered after its cutoff is abandoned: the callback never runs).
            cutoffs = self._hold(flight, lease, loop)
            if loop.time() >= lease.cutoff_at:
                await self._too_late(lease, cutoffs)
            # 4. Work, under the cutoff (a scope left on every path, without ``with``).
            started = loop.time() if self.emitter.timed else 0.0  # durations, if received
            cutoff = cutoffs.at(lease.cutoff_at)
            try:
                renewing = self.mode.leases.start(lease, cutoffs, cutoff, flight.sent)
                handle = Call(self, flight, loop, cutoff, renewing) if held else NO_HANDLE
                flight.begin()
                try:
                    result: Any = callback(*handle.args)
                    if result.__class__ is not _COROUTINE:
                        result = awaitable(result)  # (a plain function's value: it has run)
                    result = await result
                finally:
                    flight.end()
                    renewing.cancel()  # no yield first: the cutoff could undo a return
                    self.emitter.ran(started, loop)
            except BaseException as exc:
                cutoff.leave(exc)
                await self._settle_failure(exc, cutoff, handle, flight, renewing, started)
                raise
            # 5. Decide; 6. settle: the one completion write, bounded at the lease end.
            ending = decide(_RETURNED, False, cutoff.finish(), handle.said)
            if ending is not COMPLETE:
                return await self._settle_return(ending, result, flight, cutoffs)  # type: ignore[no-any-return]
            completion = self.completion_for(lease, result)
            sent = loop.time()  # the completion's life counts from (before) its write
            cutoff = cutoff.reopen(lease.write_bound(sent), shared=handle.shares_cutoff)
            with _completing((cutoff, keys.key, result)):
                written = await self.mode.store.complete(completion)
            self.completed(completion, written, result, flight, started, sent)
            return result  # type: ignore[no-any-return]
        finally:
            if self.inflight.get(keys.key) is flight:
                del self.inflight[keys.key]
            flight.settle(None)
            await renewing.stop()

    def _lease(self, flight: Flight, deadline: Deadline, loop: asyncio.AbstractEventLoop) -> Lease:
        """The lease of a claim about to be sent for ``flight``."""
        flight.sent = loop.time()  # a verdict it brings counts from here
        if deadline is None:
            self.mode.without_deadline()
        return Lease(
            flight.keys, flight.owner, deadline, self.options, flight.sent, self.mode.leases.renew
        )

    # ------------------------------------------------------------------ 1. answer early

    async def _join(self, keys: Keys, deadline: Deadline, loop: _Loop) -> Any:
        """Another call of this process claims or holds the key: replay its outcome, or
        ``_CLAIM`` when this call is to claim the key itself (the other failed, or its
        claim is still unanswered)."""
        while (flight := self.inflight.get(keys.key)) is not None:
            outcome: Any = await self.waiting.join(flight, keys, deadline, loop)
            if outcome is UNANSWERED:
                break  # ask the store ourselves
            if outcome is not None:
                self.keys.validate(outcome.record.validation, keys)
                self.emit("joined", keys.key)
                return self.replays.outcome(outcome)
        return _CLAIM

    # ------------------------------------------------------------------ 2. claim

    async def _claim_failed(
        self, lease: Lease, exc: Exception, loop: asyncio.AbstractEventLoop
    ) -> None:
        """The claim raised ``exc`` (re-raised by the caller): clean up what it may have
        written.  A refusal wrote nothing; any other failure may hide a claim that applied,
        which gets the owner-fenced release of an unknown outcome."""
        key = lease.key
        if isinstance(exc, InconsistentStateError):
            # The store could not read the record that blocked the claim, or its answer was
            # about another key: this claim's own answer is unknown.
            self.emit("record_unreadable", key, error=exc)
        elif isinstance(exc, _REFUSALS):
            return
        elif isinstance(exc, AlreadyInProgressError):
            # A transactional claim waited for the row as long as it may.
            self.emit("rejected_in_progress", key)
            return
        await self.mode.unknown_claim(lease, exc, self._shared.cutoffs(loop))

    async def _contend(
        self,
        flight: Flight,
        lease: Lease,
        verdict: Verdict,
        deadline: Deadline,
        loop: asyncio.AbstractEventLoop,
    ) -> Lease | _Replay:
        """The claim of ``lease`` met a record: replay it, or wait for it and claim again
        (a fresh lease each time), until a claim is held — its lease returned — or a record
        replayed.  The contended path's own frame: the uncontended one never enters it."""
        cutoffs = self._shared.cutoffs(loop)
        wait_until: float | None = None  # how long (loop time) it may wait on another worker
        raced = 0  # claims refused on a record the store judged claimable
        while True:
            try:  # the answer is checked before it is used
                if not isinstance(verdict, Verdict):  # a store that broke its protocol
                    raise StoreUnavailableError(
                        f"the store answered a claim of key {flight.keys.key} with {verdict!r}, "
                        "not a verdict: the callback was not run"
                    )
                check_key(verdict, flight.keys.key)
            except Exception as exc:
                await self._claim_failed(lease, exc, loop)
                raise
            state, record = verdict.found, verdict.record
            if state is Found.CLAIMED:
                if record is not None and record.steps is not None:
                    await self._resume(flight, lease, record, cutoffs)
                return lease  # the claim applied after all (or resumes recorded steps)
            if state is Found.RESUMABLE and record is not None:
                self.keys.validate(record.validation, flight.keys)
                raise PayloadValidationError(
                    f"key {flight.keys.key} holds the recovery points of a call with another "
                    "payload (another validation hash): they are not resumed with this one. "
                    "Use a new key for a new request",
                    key=flight.keys.key,
                )
            if state is Found.COMPLETED and record is not None:
                return _Replay(self.replays.record(verdict, flight))
            if state is Found.IN_PROGRESS and record is not None:
                self.keys.validate(record.validation, flight.keys)
                if wait_until is None:
                    wait_until = self.waiting.limit(deadline, loop)
                verdict, flight.sent = await self.waiting.poll(
                    self.store, flight.keys, verdict, wait_until, loop
                )
                if verdict.found is Found.COMPLETED:
                    continue  # replayed above
            else:
                # CLAIMABLE after a refused claim: it expired between the write and the
                # store's answer.
                raced += 1
                if raced > _CLAIM_RETRIES:
                    raise InconsistentStateError(
                        f"key {flight.keys.key}: the store kept refusing claims on a record it "
                        "judged claimable; check that every worker's clock is synchronised"
                    )
            # Claim again, with a fresh lease.
            lease = self._lease(flight, deadline, loop)
            try:
                verdict = await self.mode.claim(lease, loop)
            except Exception as exc:
                await self._claim_failed(lease, exc, loop)
                raise
            if verdict is CLAIMED:
                return lease

    async def _resume(self, flight: Flight, lease: Lease, record: Record, cutoffs: Cutoffs) -> None:
        """The claim kept the record's recovery points: the call resumes them.  A list that
        cannot be read leaves the claim to its lease (nothing runs)."""
        try:
            flight.steps = self.stepper.resume(record)
        except InconsistentStateError as exc:
            self.emit("record_unreadable", lease.key, error=exc)
            await self.mode.abandon(lease, exc, cutoffs)
            raise

    # ------------------------------------------------------------------ 3. hold

    def _hold(self, flight: Flight, lease: Lease, loop: _Loop) -> Cutoffs:
        """The store confirmed the claim: the key is in progress here, under ``lease``
        (the call's one lease: renewal moves it, every door reads it).  Returns the
        loop's cutoffs, which bound the work from here."""
        flight.hold(lease)
        self.emit("claimed", lease.keys.key)
        cutoffs = self._shared._cutoffs  # (_Shared.cutoffs without its frame, when made)
        if cutoffs is None or cutoffs.loop is not loop:
            cutoffs = self._shared.cutoffs(loop)
        return cutoffs

    async def _too_late(self, lease: Lease, cutoffs: Cutoffs) -> None:
        """The claim was answered after the cutoff (a slow store): its lease may have ended
        already, so the callback must not start."""
        key = lease.key
        late = _cut_off(key)
        await self.mode.abandon(lease, late, cutoffs)
        self.emit("cut_off", key)
        raise late

    # ------------------------------------------------------------------ 6. settle

    async def _settle_failure(
        self,
        exc: BaseException,
        cutoff: Cutoff,
        handle: Handle,
        flight: Flight,
        renewing: Renewing,
        started: float,
    ) -> None:
        """5. Decide how a callback that raised ``exc`` (or was cancelled) under ``cutoff``
        ended, and 6. settle it: raises what the caller gets, or returns when that is
        ``exc`` itself."""
        write, outcome = decide(
            _ended(exc, self._declared, cutoff),
            cutoff.cut_off,
            cutoff.cancelled_elsewhere(),
            handle.said,
        )
        cutoffs = self._shared.cutoffs(asyncio.get_running_loop())
        lease = flight.lease
        assert lease is not None
        key = lease.key
        if write is Write.ABANDON:
            # Our own cutoff: like a cancellation, no store write.  The record stays in
            # progress until its lease ends, a reserve from now.
            self.emit("cut_off", key)
            await self.mode.abandon(lease, exc, cutoffs)
        elif write is Write.RELEASE:
            await self._release(flight, exc, cutoffs)
        elif write is Write.COMPLETE_NOT_STORED:
            await self._complete_not_awaitable(flight, exc, cutoffs.loop, started)
        elif write is Write.COMPLETE_ERROR:
            assert isinstance(exc, Exception)
            await self._complete_error(flight, exc, cutoffs.loop, started)
        if outcome is Outcome.CUT_OFF:
            if renewing.lost:
                raise _renewal_refused(key) from exc
            raise _cut_off(key) from exc
        if outcome is Outcome.CANCELLED and not isinstance(exc, asyncio.CancelledError):
            # The caller was cancelled and the callback turned it into another exception.
            raise asyncio.CancelledError from exc
        if outcome is Outcome.NOT_AWAITABLE:
            assert isinstance(exc, ReturnedNotAwaitable)
            raise not_awaitable_error(exc.value, key) from None

    async def _settle_return(
        self, ending: Decision, result: Any, flight: Flight, cutoffs: Cutoffs
    ) -> Any:
        """Carry out ``ending`` for a callback that returned ``result`` and needs no
        completion from here."""
        write, outcome = ending
        if outcome is Outcome.CANCELLED:
            # The callback swallowed its caller's cancellation: no store write after it.
            raise asyncio.CancelledError
        if write is Write.RELEASE:
            # The callback asked for the key back (Call.release): no completion.
            await self._release(flight, None, cutoffs)
        return result

    async def _complete_not_awaitable(
        self,
        flight: Flight,
        returned: BaseException,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        """The callback returned something that is not awaitable: it ran (a plain function),
        so the key is completed without a response, never released; the caller raises
        ConfigError."""
        assert isinstance(returned, ReturnedNotAwaitable) and flight.lease is not None
        key = flight.keys.key
        error = not_awaitable_error(returned.value, key)
        self.emit("response_not_stored", key, error=error)
        reason = not_awaitable_reason(returned.value)
        completion = self.completion_without_response(flight.lease, reason)
        try:
            await self.complete_held(flight, completion, None, loop, started)
        except CompletionError as failed:
            raise error from failed

    async def _complete_error(
        self,
        flight: Flight,
        error: Exception,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        """The callback raised an error declared a result (``replay_errors``): the record
        completes with it, and the caller gets ``error`` itself.  A failed completion is a
        note on it (the key stays in progress until its lease ends, or completed)."""
        settings = self.replays.responses.declared
        assert settings is not None and flight.lease is not None
        value, encoded = encode_error(error, settings, self.store.max_response_bytes)
        lease = flight.lease
        completion = Completion(
            lease.keys.key,
            lease.owner,
            self.options.clock(),
            self.options.expires_after,
            lease.keys.validation,
            encoded,
            value,
        )
        try:
            await self.complete_held(flight, completion, None, loop, started)
        except CompletionError as failed:
            error.add_note(
                f"idempotency: recording this error as the call's result failed: {failed}"
            )

    async def _release(self, flight: Flight, exc: BaseException | None, cutoffs: Cutoffs) -> None:
        """Give the key back after a callback that raised ``exc`` or asked for it (None:
        ``Call.release``) — unless a step ran and its recovery point may be missing (or it
        still runs): a retry before the lease ends would run it again, so the key is left
        to its lease, as a cut-off call's is."""
        lease = flight.lease
        assert lease is not None
        if _step_unsettled(flight):
            await self.mode.abandon(lease, exc, cutoffs)
            return
        released = await self.mode.release(lease, exc, cutoffs)
        if released is True:
            self.emit("released", lease.key)
        elif released is False:
            self.emit("lease_lost", lease.key, error=exc)

    # ------------------------------------------------------------------ completion

    def completion_for(self, lease: Lease, result: Any) -> Completion:
        """The completion recording ``result`` (encoded once; a failure becomes a reason)."""
        keys = lease.keys
        value, encoded, failure = self.replays.responses.encode(
            result, self.store.max_response_bytes, keys.key
        )
        reason = None
        if failure is not None:
            reason = not_stored_reason(failure)
            log_not_stored(keys.key, failure)
            self.emit("response_not_stored", keys.key, error=failure)
        return _tuple_new(
            Completion,
            (
                keys.key,
                lease.owner,
                self.options.clock(),
                self.options.expires_after,
                keys.validation,
                encoded,
                value,
                reason,
            ),
        )

    def completion_without_response(self, lease: Lease, reason: str | None) -> Completion:
        keys = lease.keys
        return Completion(
            keys.key,
            lease.owner,
            self.options.clock(),
            self.options.expires_after,
            keys.validation,
            None,
            None,
            reason,
        )

    async def complete_held(
        self,
        flight: Flight,
        completion: Completion,
        result: Any,
        loop: asyncio.AbstractEventLoop,
        started: float,
        renewing: Renewing = NOT_RENEWING,
    ) -> Written:
        """Write a completion while the callback may still run, and settle the flight:
        duplicates of this process go to the store (or the cache) from now on — the key is
        completed, so they must replay, never hear "in progress".  Bounded by the lease as
        renewed, by ``renewing`` too while the write runs."""
        lease = flight.lease
        assert lease is not None
        sent = loop.time()
        bound = self._shared.cutoffs(loop).at(lease.write_bound(sent))
        renewing.follow(bound, sent)
        with _completing((bound, lease.key, result)):
            written = await self.store.complete(completion)
        if self.inflight.get(completion.key) is flight:
            del self.inflight[completion.key]
        self.completed(completion, written, result, flight, started, sent)
        flight.settle(None)
        return written

    def completed(
        self,
        completion: Completion,
        written: Written,
        result: Any,
        flight: Flight,
        started: float,
        sent: float,
    ) -> None:
        """Settle a completion written by a request sent at ``sent`` (loop time), of a
        callback started at ``started`` (0.0: nothing receives durations)."""
        key = completion.key
        encoded = completion.encoded
        if written is _RESPONSE:
            if encoded is None:
                # The store kept the owner's response over this completion without one (a
                # response is final): what it holds is not what was sent, so nothing in
                # this process is told from it; duplicates read the record.
                return
        elif written is _WITHOUT_RESPONSE:
            if encoded is not None:
                # The store could not keep what the manager encoded (too large for it, or
                # a value it cannot hold; the store logs which, and its record says why):
                # every caller, here and in other processes, gets ResponseNotStoredError.
                why = f"the store could not keep the response ({len(encoded)} bytes of JSON)"
                not_kept = ResponseNotStoredError(why, key=key, reason=why)
                log_not_stored(key, not_kept)
                self.emit("response_not_stored", key, error=not_kept)
                completion = completion._replace(encoded=None, response=None, not_stored=why)
                encoded = None
        elif written is _NOTHING:
            error = LeaseLostError(
                f"the lease of key {key} ended before the call finished and another worker "
                "claimed the key; its record was left intact. Give calls a deadline that covers "
                "their work. The result is on this error.",
                key=key,
                result=result,
            )
            self.emit("lease_lost", key, error=error)
            raise error
        else:
            # Not an answer: whether (and what) the completion wrote is unknown.
            nonsense = StoreUnavailableError(
                f"the store answered a completion of key {key} with {written!r}"
            )
            raise _completion_failed(key, result, nonsense, unknown=True) from nonsense
        if self.mode.publish(flight, completion, encoded, sent):
            duration = asyncio.get_running_loop().time() - started if started else 0.0
            self.emit("completed", key, duration=duration)

    # ------------------------------------------------------------------ other doors

    async def read(
        self, keys: Keys, deadline: Deadline, loop: asyncio.AbstractEventLoop, default: Any
    ) -> Any:
        """The stored result of ``keys`` read without claiming (``Manager.replay``): one
        read bounded by ``deadline``, never cached; ``default`` when no record lives."""
        key = keys.key
        bound = asyncio.timeout_at(deadline)
        try:
            async with bound:
                verdict = await self.store.get(key, now=self.options.clock())
            check_key(verdict, key)
        except InconsistentStateError as exc:
            self.emit("record_unreadable", key, error=exc)
            raise
        except TimeoutError as exc:
            # Asked, not judged by the clock: the loop runs a timer up to its clock
            # resolution early.
            if isinstance(exc, DeadlineExceededError) or not bound.expired():
                raise
            raise DeadlineExceededError(
                f"the read of key {key} got no answer before its deadline", key=key
            ) from exc
        record = verdict.record
        if record is None or verdict.found is Found.CLAIMABLE:
            return default
        self.keys.validate(record.validation, keys)
        if verdict.found is Found.IN_PROGRESS:
            self.waiting.refuse(key, verdict.retry_after)
        if not record.response_stored:
            raise not_stored_error(record)
        self.emit("replayed", key)
        return self.replays.responses.present(record.response, record)

    async def force_release(self, key: str) -> Record | None:
        """Delete the record of ``key`` whatever its state; the cache keeps no entry of it."""
        replays = self.replays
        replays.releasing(key)
        try:
            deleted = await self.store.force_release(key)
        finally:
            now = asyncio.get_running_loop().time()
            replays.released(key, now)
            # A call of this process whose claim went out before the release ended may
            # yet be answered with the record released: later calls must not join it.
            flight = self.inflight.get(key)
            if flight is not None and flight.sent <= now:
                del self.inflight[key]
        self.emit("released", key)
        return deleted

    async def unprotected(
        self,
        callback: Callable[[], Awaitable[T]],
        deadline: Deadline,
        loop: asyncio.AbstractEventLoop,
    ) -> T:
        """Run a call without idempotency (no key, or disabled), still bounded by its
        deadline.  A callback that returned something not awaitable has run, and there is
        nothing to record: ``ConfigError``."""
        started = loop.time()
        unprotected = UNPROTECTED.set(True)  # steps run unrecorded in it
        try:
            if deadline is None:
                return await _awaitable(callback())
            try:
                with self._shared.cutoffs(loop).at(deadline) as cutoff:
                    return await _awaitable(callback())
            except asyncio.CancelledError as exc:
                if cutoff.cut_off:
                    raise DeadlineExceededError(
                        "the call (run without idempotency: no key) passed its deadline"
                    ) from exc
                raise
        except ReturnedNotAwaitable as returned:
            raise not_awaitable_error(returned.value, None) from None
        finally:
            UNPROTECTED.reset(unprotected)
            self.emitter.ran(started, loop)


class _Completing(list[Any]):
    """The scope of a completion write, ``(cutoff, key, result)``: bounded by ``cutoff``
    (opened at the lease end), and its failures mapped to what the caller gets —
    ``CompletionError`` (carrying the result, and whether the write may have applied), or
    the exception itself when it is the caller's cancellation or a transaction to run
    again.  Synchronous, and a list made by :data:`_completing`: entering it runs no
    Python frame, and making it none either (every first call makes one: a list subclass
    is filled by ``list.__init__``, in C, for less than a tuple subclass is built)."""

    __slots__ = ()

    # A builtin, so ``with`` calls no Python code to enter (what it returns is not used).
    __enter__ = list.__len__

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        cutoff = self[0]
        if exc is None:
            cutoff.close()
            return
        failure = _completion_failure(cutoff, exc, self[1], self[2])
        cutoff.close()
        if failure is not None:
            raise failure from exc


_completing: Final[Callable[[tuple[Cutoff, str, Any]], _Completing]] = _Completing


def _completion_failure(
    cutoff: Cutoff, exc: BaseException, key: str, result: Any
) -> CompletionError | None:
    """What a failed completion write raises (None: ``exc`` itself, e.g. the caller's
    cancellation)."""
    if isinstance(exc, asyncio.CancelledError):
        if cutoff.fired():
            abandoned = TimeoutError("abandoned at the lease end")
            return _completion_failed(key, result, abandoned, unknown=True)
        return None
    if isinstance(exc, TransactionRetryError):
        # A transactional call's completion met a concurrent transaction (a serialization
        # failure under SERIALIZABLE, a deadlock): nothing of the call can commit, and the
        # remedy is the same as for its claim — run the whole transaction again.
        return None
    if isinstance(exc, Exception):
        # Anything but a definite refusal may hide a write that applied.
        return _completion_failed(key, result, exc, unknown=not isinstance(exc, _REFUSALS))
    return None


def _awaitable(pending: Awaitable[T]) -> Awaitable[T]:
    return pending if hasattr(pending, "__await__") else awaitable(pending)


def _ended(exc: BaseException, declared: tuple[type[Exception], ...], cutoff: Cutoff) -> Ended:
    """How a callback that raised ``exc`` ended (for the decision table); ``declared``:
    the classes of errors that are results (``replay_errors``) — unless its cutoff fired:
    raised after that, the error may be how it took the cutoff, not a deterministic one."""
    if isinstance(exc, ReturnedNotAwaitable):
        return Ended.NOT_AWAITABLE
    if isinstance(exc, asyncio.CancelledError):
        return Ended.CANCELLED
    if isinstance(exc, Exception):
        if isinstance(exc, declared) and not cutoff.expired:
            return Ended.DECLARED
        return Ended.RAISED
    return Ended.CRASHED


def _step_unsettled(flight: Flight) -> bool:
    """Whether a step of ``flight`` ran and its recovery point may be missing — or is
    still running (a step the callback left behind, under ``asyncio.gather`` or in a task
    it spawned): released, the key would let a retry run it again beside it."""
    steps = flight.steps
    return isinstance(steps, Progress) and (steps.unsettled or steps.current is not None)


def _replayable(verdict: Verdict, key: str) -> bool:
    """Whether a claim's answer is the common replay: a completed record of ``key`` (any
    other answer, or one about another key, goes to ``Lifecycle._contend``)."""
    if verdict.__class__ is not Verdict or verdict.found is not _COMPLETED:
        return False
    record = verdict.record
    return record is not None and record.key == key


def _cut_off(key: str) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"the call for key {key} was cut off before its lease ended, leaving time to record "
        "it; nothing was recorded, and the key is claimable again once the lease ends",
        key=key,
    )


def _renewal_refused(key: str) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"the call for key {key} was cut off because the store refused to renew its lease: "
        "the lease had lapsed and the key may be claimed by another worker. Nothing was "
        "recorded; renew more often (Renewal(every=...)) or give Renewal(lease=...) more slack",
        key=key,
    )


def _completion_failed(
    key: str, result: Any, exc: BaseException, *, unknown: bool
) -> CompletionError:
    if unknown:
        what = f"did not get an answer ({exc!r}), so its outcome is unknown: the record may be "
        what += "completed, or stay in progress until its lease ends"
    else:
        what = f"failed ({exc}); the key stays in progress until its lease ends"
    return CompletionError(
        f"the call for key {key} succeeded but recording its result {what}. The result is on "
        "this error",
        key=key,
        result=result,
        outcome_unknown=unknown,
    )
