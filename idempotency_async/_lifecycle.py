"""The lifecycle of one idempotent call: claim → hold → run under the cutoff → complete or
release.  There is one implementation, :meth:`Lifecycle.run`; every entry point is a door
into it (``Manager.execute`` runs a zero-argument callback, ``Manager.execute_call`` one
that receives the :class:`Call` and may complete the record before it returns).

The uncontended path — claim, callback, completion — awaits from the one frame of
:meth:`Lifecycle.run`: with thousands of calls in flight every live coroutine frame is
garbage-collector work.  What it shares with the other paths is plain functions returning
values (:func:`_completion_failure` maps a completion write's failures, around the write's
own ``try``), so sharing costs no frame.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from idempotency_async._callback import (
    ReturnedNotAwaitable,
    awaitable,
    not_awaitable_error,
    not_awaitable_reason,
)
from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._downstream import Run
from idempotency_async._emission import Emitter
from idempotency_async._flight import Flight, Outcome
from idempotency_async._keys import KeyDeriver, Keys
from idempotency_async._lease import Held, Lease, lease_for
from idempotency_async._renewal import Renewal, short_lease
from idempotency_async._responses import (
    Replays,
    log_not_stored,
    not_stored_reason,
)
from idempotency_async._waiting import UNANSWERED, Waiting
from idempotency_async.errors import (
    AlreadyInProgressError,
    CompletionError,
    ConfigError,
    DeadlineExceededError,
    InconsistentStateError,
    LeaseLostError,
    ResponseNotStoredError,
    StoreAccessDeniedError,
    StoreUnavailableError,
    StoreValidationError,
    TransactionRetryError,
)
from idempotency_async.options import Options
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import CLAIMED, State, Store, Verdict, Written, check_key

__all__ = ["Call", "Lifecycle", "TransactionalStore", "Unprotected"]

T = TypeVar("T")

_log = logging.getLogger("idempotency_async")

_CLAIM_RETRIES = 2
_UNDO_BOUND = 0.5  # seconds a transactional call's undo may take after its deadline
# Store errors that refuse a claim outright (the request, or the record it met, cannot be
# processed): nothing was written.  Any other failure may hide a claim that applied.
_REFUSALS = (StoreAccessDeniedError, StoreValidationError)


class TransactionalStore(Store, Protocol):
    """A store whose operations run in a caller's database transaction (Postgres): a claim
    waits on the row another open transaction holds, for at most ``wait`` seconds."""

    async def claim_within(self, claim: Claim, wait: float) -> Verdict: ...


class _Replayed(NamedTuple):
    """A claim that found the key completed: the value to return instead of running."""

    value: Any


_COMPLETED = State.COMPLETED  # a global reads faster than an Enum member (Python 3.11)
# What a contended claim does next: claim again (a fresh lease), or hold the key.
_AGAIN = object()
_HELD = object()


class Lifecycle:
    """The one implementation of an idempotent call, for one manager.

    Holds what a call needs — the store round trips go to, the single-flight table, the
    local cache, the cutoffs — and nothing of the manager that wires it.

    A transactional call runs the same lifecycle on a view of it (:meth:`in_transaction`)
    whose store is the caller's transaction: nothing there may learn the result before the
    caller commits, so the view has no local cache and no single flight (duplicates in
    this process wait on the row like any other), renews nothing (the row lock holds the
    key), and releases by rolling its savepoint back.
    """

    transaction: TransactionalStore | None = None

    def __init__(
        self,
        store: Store,
        options: Options,
        keys: KeyDeriver,
        emitter: Emitter,
    ) -> None:
        self.store = store
        """Where round trips go: the observer's timing wrapper once calls are observed."""
        self.options = options
        self.keys = keys
        self.emitter = emitter
        self.emit = emitter.emit  # bound once: the plain path emits twice per call
        self.replays = Replays(options, keys, emitter)
        self.encode = self.replays.responses.encode
        self.waiting = Waiting(options, keys, emitter)
        self.inflight: dict[str, Flight] = {}
        # Owner tokens: random per manager, unique per claim, cheap to make.
        self._owner_prefix = secrets.token_hex(12) + "-"
        self._claims = itertools.count()
        self._cutoffs: Cutoffs | None = None
        self._warned_no_deadline = False
        self._renewing = options.renew_lease is not None
        self._uncached: Replays | None = None

    def in_transaction(self, store: TransactionalStore) -> Lifecycle:
        """This lifecycle for one transactional call on ``store``."""
        view = copy.copy(self)
        view.store = view.transaction = store
        view._renewing = False
        if self._uncached is None:
            self._uncached = Replays(self.options, self.keys, self.emitter)
            self._uncached.cache = None
        view.replays = self._uncached
        return view

    # ------------------------------------------------------------------ the one lifecycle

    async def run(
        self,
        keys: Keys,
        when: float | None,
        callback: Callable[..., Awaitable[T]],
        loop: asyncio.AbstractEventLoop,
        held: bool,
    ) -> T:
        """Replay, join, or claim the key and run ``callback`` — ``callback(call)`` when
        ``held``, ``callback()`` otherwise — then complete or release the record."""
        key = keys.key
        replays = self.replays
        transaction = self.transaction
        if replays.cache is not None:
            entry = replays.cache.get(key, loop.time())
            if entry is not None:
                return replays.hit(entry, keys)  # type: ignore[no-any-return]
        while transaction is None:
            flight = self.inflight.get(key)
            if flight is None:
                break
            outcome = await self.waiting.join(flight, keys, when, loop)
            if outcome is UNANSWERED:
                break  # the other call's claim is still unanswered: ask the store ourselves
            if outcome is not None:
                assert isinstance(outcome, Outcome)
                self.keys.validate(outcome.record.validation, keys)
                self.emit("joined", key)
                return replays.outcome(outcome)  # type: ignore[no-any-return]
        flight = Flight(keys, when, f"{self._owner_prefix}{next(self._claims)}")
        if transaction is None:
            self.inflight[key] = flight
        renewal: Renewal | None = None
        try:
            while True:
                # A claim goes out now: a verdict it brings counts from here.
                flight.sent = now = loop.time()
                if when is None and transaction is None:
                    self._diagnose_no_deadline()  # (a transaction's row lock needs none)
                lease = lease_for(keys, flight.owner, when, self.options, now)
                if self._renewing:
                    # The call's hard bound stays; the claim writes the short lease.
                    hard_end = lease.ends_at
                    lease = short_lease(self.options, lease)
                try:
                    if transaction is None:
                        verdict = await self.store.claim(lease.claim)
                    else:
                        verdict = await transaction.claim_within(
                            lease.claim, self.waiting.lock_wait(lease.cutoff_at, loop)
                        )
                    if verdict is not CLAIMED and verdict.__class__ is Verdict:
                        check_key(verdict, key)
                except InconsistentStateError as exc:
                    # The store could not read the record that blocked the claim, or its
                    # answer was about another key: then this claim's own answer is unknown
                    # (it may have applied), so it gets the owner-fenced release of an
                    # unknown outcome, which deletes nothing but this claim's record.
                    self.emit("record_unreadable", key, error=exc)
                    if transaction is None:
                        await self._release_unknown_claim(lease, exc, loop)
                    raise
                except _REFUSALS:
                    raise
                except AlreadyInProgressError:
                    # A transactional claim waited for the row as long as it may.
                    self.emit("rejected_in_progress", key)
                    raise
                except Exception as exc:
                    if transaction is None:
                        # (A transactional claim rolled its savepoint back itself.)
                        await self._release_unknown_claim(lease, exc, loop)
                    raise
                if verdict is CLAIMED:
                    break
                record = verdict.record if verdict.__class__ is Verdict else None
                if record is not None and verdict.state is _COMPLETED:
                    # The common replay, answered here: no frame for it.
                    return replays.record(verdict, flight)  # type: ignore[no-any-return]
                step = await self._contend(flight, lease, verdict, loop)
                if step is _HELD:
                    break
                if step is not _AGAIN:
                    assert isinstance(step, _Replayed)
                    return step.value  # type: ignore[no-any-return]
            if transaction is not None and loop.time() >= lease.cutoff_at:
                # Claimed too late to run: no INPROGRESS row is left in the transaction.
                late = _cut_off(key)
                await self._release(lease, late, loop)
                self.emit("cut_off", key)
                raise late
            holder = self._start_holding(flight, lease, loop)
            started = loop.time()
            cutoffs = self._cutoffs_of(loop)
            timer = cutoffs.start(lease.cutoff_at)
            call = Call(self, flight, holder, loop, timer) if held else None
            if self._renewing:
                renewal = Renewal(
                    self.store, self.options, self.emitter, holder, hard_end, cutoffs, timer
                )
                renewal.start(now)  # the first renewal counts from the claim's send
            run = Run(key)  # what downstream keys see while the callback runs
            try:
                try:
                    pending = callback() if call is None else callback(call)
                    if not hasattr(pending, "__await__"):
                        pending = awaitable(pending)  # a plain function: it has run already
                    result = await pending
                finally:
                    run.end()
                    if renewal is not None:
                        # No renewal after the callback, its cutoff or its caller's
                        # cancellation: cancelled now, without yielding (the cutoff could
                        # fire in between and undo a callback that returned); awaited
                        # before the call returns.
                        renewal.cancel()
                    lease = holder.lease  # as renewed: what bounds the writes after it
            except ReturnedNotAwaitable as returned:
                timer.close()
                if call is None or not call.answered:
                    await self._complete_not_awaitable(flight, lease, returned, loop, started)
                raise not_awaitable_error(returned.value, key) from None
            except asyncio.CancelledError as exc:
                cut_off = timer.fired()
                timer.close()
                answered = call is not None and call.answered
                if cut_off and not answered:
                    # Our own cutoff: like a cancellation, no store write.  The record stays
                    # in progress until its lease ends, a reserve from now.  (In a caller's
                    # transaction its savepoint is rolled back: nothing is left half done.)
                    self.emit("cut_off", key)
                    if transaction is not None:
                        await self._release(lease, exc, loop)
                    if renewal is not None and renewal.lost:
                        raise _renewal_refused(key) from exc
                    raise _cut_off(key) from exc
                if cut_off or answered or timer.cancelled_elsewhere():
                    raise  # the caller was cancelled (or the key is completed): no write
                # A CancelledError the callback raised on its own is its own exception.
                await self._release_after_failure(lease, exc, loop)
                raise
            except Exception as exc:
                timer.close()  # only the callback runs under the cutoff
                if timer.cancelled_elsewhere():
                    # The caller was cancelled and the callback turned it into another
                    # exception: no store write after a cancellation.
                    raise asyncio.CancelledError from exc
                if call is None or not call.answered:
                    await self._release_after_failure(lease, exc, loop)
                raise
            except BaseException:
                # SystemExit, KeyboardInterrupt, a test framework's failure: like a crash, no
                # store write; the record waits for its lease.  The cutoff must not outlive
                # the callback and cancel the caller later, in unrelated code.
                timer.close()
                raise
            sent = loop.time()  # the completion's life counts from (before) its write
            timer.close()
            if timer.cancelled_elsewhere():
                # The callback swallowed its caller's cancellation: no store write after it.
                raise asyncio.CancelledError
            if call is not None:
                if call.answered:
                    return result
                if call.released is not None:
                    # The callback asked for the key back (Call.release): no completion.
                    await self._release_after_failure(lease, None, loop)
                    return result
            completion = self.completion_for(lease, result)
            timer = cutoffs.start(max(lease.ends_at, loop.time() + lease.reserve))
            try:
                written = await self.store.complete(completion)
                if written.__class__ is not Written:
                    raise _not_an_answer(key, written)
            except BaseException as exc:
                failure = _completion_failure(timer, exc, key, result)
                if failure is None:
                    raise
                raise failure from exc
            finally:
                timer.close()
            self.completed(completion, written, result, flight, loop.time() - started, sent)
            return result
        finally:
            if self.inflight.get(key) is flight:
                del self.inflight[key]
            flight.settle(None)
            if renewal is not None:
                await renewal.stop()

    # ------------------------------------------------------------------ claim

    def _start_holding(self, flight: Flight, lease: Lease, loop: asyncio.AbstractEventLoop) -> Held:
        """The claim is confirmed: hold the key in this process, unless it came too late.
        Returns the call's lease holder (renewal moves it; every door reads it)."""
        key = lease.claim.key
        holder = Held(lease, self.options.lease_margin)
        flight.hold(holder)
        self.emit("claimed", key)
        if loop.time() >= lease.cutoff_at:
            # The claim was answered after the cutoff (a slow store): its lease may have
            # ended already, so the callback must not start.
            self.emit("cut_off", key)
            raise _cut_off(key)
        return holder

    async def _release_unknown_claim(
        self, lease: Lease, exc: BaseException, loop: asyncio.AbstractEventLoop
    ) -> None:
        """One owner-fenced release after a claim whose outcome is unknown (unavailable,
        throttled after a lost answer, an answer that is not one): the write may have
        applied, and without this release the key would stay blocked for the whole lease by
        a claim nobody holds.  A failed release is a note on ``exc``."""
        await self._release(lease, exc, loop)

    async def _contend(
        self,
        flight: Flight,
        lease: Lease,
        verdict: Verdict,
        loop: asyncio.AbstractEventLoop,
    ) -> object:
        """The claim met a record: replay it (``_Replayed``), wait for it and claim again
        (``_AGAIN``), or find the claim applied after all (``_HELD``)."""
        if not isinstance(verdict, Verdict):  # a store that broke its protocol
            nonsense = StoreUnavailableError(  # type: ignore[unreachable]
                f"the store answered a claim of key {flight.keys.key} with {verdict!r}, "
                "not a verdict: the callback was not run"
            )
            # Whether the claim applied is unknown.
            await self._release_unknown_claim(lease, nonsense, loop)
            raise nonsense
        state, record = verdict.state, verdict.record
        if state is State.CLAIMED:
            return _HELD
        if state is State.COMPLETED and record is not None:
            return _Replayed(self.replays.record(verdict, flight))
        if state is State.IN_PROGRESS and record is not None:
            self.keys.validate(record.validation, flight.keys)
            if flight.wait_until is None:
                flight.wait_until = self.waiting.limit(flight.deadline, loop)
            verdict, flight.sent = await self.waiting.poll(
                self.store, flight.keys, verdict, flight.wait_until, loop
            )
            if verdict.state is State.COMPLETED:
                return await self._contend(flight, lease, verdict, loop)
        else:
            # CLAIMABLE after a refused claim: it expired between the write and the
            # store's answer.
            flight.raced += 1
            if flight.raced > _CLAIM_RETRIES:
                raise InconsistentStateError(
                    f"key {flight.keys.key}: the store kept refusing claims on a record it "
                    "judged claimable; check that every worker's clock is synchronised"
                )
        return _AGAIN

    def _cutoffs_of(self, loop: asyncio.AbstractEventLoop) -> Cutoffs:
        cutoffs = self._cutoffs
        if cutoffs is None or cutoffs.loop is not loop:
            cutoffs = self._cutoffs = Cutoffs(loop)
        return cutoffs

    # ------------------------------------------------------------------ completion

    def completion_for(self, lease: Lease, result: Any) -> Completion:
        """The completion recording ``result`` (encoded once; a failure becomes a reason)."""
        claim = lease.claim
        encoded = self.encode(result, self.store.max_response_bytes)
        reason = None
        if encoded.reason is not None:
            reason = not_stored_reason(encoded.reason)
            log_not_stored(claim.key, encoded.reason)
            self.emit("response_not_stored", claim.key, error=encoded.reason)
        return Completion(
            claim.key,
            claim.owner,
            self.options.clock(),
            self.options.expires_after,
            claim.validation,
            encoded.encoded,
            encoded.value,
            reason,
        )

    def completion_without_response(self, lease: Lease, reason: str | None) -> Completion:
        claim = lease.claim
        return Completion(
            claim.key,
            claim.owner,
            self.options.clock(),
            self.options.expires_after,
            claim.validation,
            None,
            None,
            reason,
        )

    async def complete_held(
        self,
        flight: Flight,
        lease: Lease,
        completion: Completion,
        result: Any,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> Written:
        """Write a completion while the callback may still run, and settle the flight:
        duplicates of this process go to the store (or the cache) from now on — the key is
        completed, so they must replay, never hear "in progress"."""
        sent = loop.time()
        key = completion.key
        timer = self._cutoffs_of(loop).start(max(lease.ends_at, loop.time() + lease.reserve))
        try:
            written = await self.store.complete(completion)
            if written.__class__ is not Written:
                raise _not_an_answer(key, written)
        except BaseException as exc:
            failure = _completion_failure(timer, exc, key, result)
            if failure is None:
                raise
            raise failure from exc
        finally:
            timer.close()
        if self.inflight.get(completion.key) is flight:
            del self.inflight[completion.key]
        self.completed(completion, written, result, flight, loop.time() - started, sent)
        flight.settle(None)
        return written

    def completed(
        self,
        completion: Completion,
        written: Written,
        result: Any,
        flight: Flight,
        duration: float,
        sent: float,
    ) -> None:
        """Settle a completion written by a request sent at ``sent`` (loop time)."""
        key = completion.key
        if written is Written.NOTHING:
            error = LeaseLostError(
                f"the lease of key {key} ended before the call finished and another worker "
                "claimed the key; its record was left intact. Give calls a deadline that covers "
                "their work. The result is on this error.",
                key=key,
                result=result,
            )
            self.emit("lease_lost", key, error=error)
            raise error
        encoded = completion.encoded
        if written is Written.WITHOUT_RESPONSE and encoded is not None:
            # The store could not keep what the manager encoded (too large for it, or a
            # value it cannot hold; the store logs which, and its record says why): every
            # caller, here and in other processes, now gets ResponseNotStoredError.
            why = f"the store could not keep the response ({len(encoded)} bytes of JSON)"
            not_kept = ResponseNotStoredError(why, key=key, reason=why)
            log_not_stored(key, not_kept)
            self.emit("response_not_stored", key, error=not_kept)
            completion = completion._replace(encoded=None, response=None, not_stored=why)
            encoded = None
        if self.transaction is not None:
            return  # nothing learns the result before the caller's COMMIT
        replays = self.replays
        if flight.waiters or replays.cache is not None:
            record = completion.to_record(completion.now)
            flight.settle(Outcome(record, encoded))
            if replays.cache is not None and encoded is not None:
                # The record lives expires_after from the completion, by the store's clock.
                replays.fill(record, encoded, sent, completion.ttl)
        self.emit("completed", key, duration=duration)

    async def _complete_not_awaitable(
        self,
        flight: Flight,
        lease: Lease,
        returned: ReturnedNotAwaitable,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        """The callback returned something that is not awaitable: it ran (a plain function),
        so the key is completed without a response, never released; the caller raises
        ConfigError."""
        key = lease.claim.key
        error = not_awaitable_error(returned.value, key)
        self.emit("response_not_stored", key, error=error)
        completion = self.completion_without_response(lease, not_awaitable_reason(returned.value))
        try:
            await self.complete_held(flight, lease, completion, None, loop, started)
        except CompletionError as failed:
            raise error from failed

    # ------------------------------------------------------------------ release

    async def _release_after_failure(
        self, lease: Lease, exc: BaseException | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        released = await self._release(lease, exc, loop)
        if released is True:
            self.emit("released", lease.claim.key)
        elif released is False:
            self.emit("lease_lost", lease.claim.key, error=exc)

    async def _release(
        self, lease: Lease, exc: BaseException | None, loop: asyncio.AbstractEventLoop
    ) -> bool | None:
        """Owner-fenced release, abandoned at the lease end; a failure becomes a note on
        ``exc`` (None returned; without ``exc`` only the ``release_failed`` event tells),
        never the caller's outcome."""
        key = lease.claim.key
        # Undoing a transactional call is a statement in the caller's transaction: cutting it
        # short could abort that transaction, so it gets at least _UNDO_BOUND.
        grace = lease.reserve if self.transaction is None else max(lease.reserve, _UNDO_BOUND)
        timer = self._cutoffs_of(loop).start(max(lease.ends_at, loop.time() + grace))
        try:
            return await self.store.release(key, lease.claim.owner)
        except asyncio.CancelledError as cancelled:
            if not timer.fired():
                raise
            failure: BaseException = cancelled
            why = "was abandoned at the lease end"
        except Exception as error:
            failure = error
            why = f"failed ({error!r})"
        finally:
            timer.close()
        if exc is None:
            pass  # released on request (Call.release): the event below reports it
        elif self.transaction is not None:
            # Undoing a transactional call failed: its claim is still in the caller's
            # transaction, whose COMMIT the table's guard refuses.
            exc.add_note(
                f"idempotency-async: undoing the transactional call of key {key} {why}; "
                "roll the transaction back (its COMMIT would be refused)"
            )
        else:
            exc.add_note(
                f"idempotency-async: releasing key {key} {why}; the key stays in progress "
                "until its lease ends"
            )
        self.emit("release_failed", key, error=failure)
        return None

    async def force_release(self, key: str) -> Record | None:
        """Delete the record of ``key`` whatever its state; the cache keeps no entry of it."""
        replays = self.replays
        replays.releasing(key)
        try:
            deleted = await self.store.force_release(key)
        finally:
            replays.released(key, asyncio.get_running_loop().time())
        self.emit("released", key)
        return deleted

    # ------------------------------------------------------------------ no key

    async def unprotected(
        self,
        callback: Callable[[], Awaitable[T]],
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> T:
        """Run a call without idempotency (no key, or disabled), still bounded by its deadline."""
        if deadline is None:
            return await callback()
        timer = self._cutoffs_of(loop).start(deadline)
        try:
            return await callback()
        except asyncio.CancelledError as exc:
            if timer.fired():
                raise DeadlineExceededError(
                    "the call (run without idempotency: no key) passed its deadline"
                ) from exc
            raise
        finally:
            timer.close()

    # ------------------------------------------------------------------ diagnostics

    def _diagnose_no_deadline(self) -> None:
        if self._warned_no_deadline:
            return
        self._warned_no_deadline = True
        _log.warning(
            "idempotent calls of this manager run without a deadline: each callback is cut off "
            "before its lease of %s s ends, and a crash leaves the key in progress that long. "
            "Pass timeout=, use `async with deadline(...)`, or set Options(lease=...)",
            self.options.lease or self.options.expires_after,
            extra={"idempotency_prefix": self.keys.prefix},
        )


def _not_an_answer(key: str, answer: object) -> StoreUnavailableError:
    # Not an answer: whether (and what) the completion wrote is unknown.
    return StoreUnavailableError(f"the store answered a completion of key {key} with {answer!r}")


def _completion_failure(
    timer: Cutoff, exc: BaseException, key: str, result: Any
) -> CompletionError | None:
    """What a failed completion write raises (None: ``exc`` itself, e.g. the caller's
    cancellation).  A plain function around the write's own try, so the write is awaited
    from its caller's frame."""
    if isinstance(exc, asyncio.CancelledError):
        if timer.fired():
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
        "_held",
        "_lifecycle",
        "_loop",
        "_started",
        "answered",
        "released",
        "stored",
    )

    def __init__(
        self,
        lifecycle: Lifecycle,
        flight: Flight,
        held: Held,
        loop: asyncio.AbstractEventLoop,
        cutoff: Cutoff,
    ) -> None:
        self._lifecycle = lifecycle
        self._flight = flight
        self._held = held  # the call's lease, as renewed: read at each write
        self._loop = loop
        self._cutoff = cutoff
        self._started = loop.time()
        self.answered = False
        """Whether a completion was attempted (the key is never released after that)."""
        self.stored = False
        """Whether the record holds a response (no further completion is allowed)."""
        self.released: str | None = None
        """The reason given to :meth:`release`, once the callback asked for it."""

    @property
    def key(self) -> str:
        return self._flight.keys.key

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

    async def complete(self, result: Any) -> None:
        """Complete the record with ``result`` now (encoded as ``execute`` would store it).

        Raises :class:`~idempotency_async.errors.LeaseLostError` or
        :class:`~idempotency_async.errors.CompletionError` as ``execute`` does; the key is
        not released either way.
        """
        await self._write(self._lifecycle.completion_for(self._held.lease, result), result)

    async def complete_without_response(self, reason: str) -> None:
        """Complete the record now without a response; duplicates get
        :class:`~idempotency_async.errors.ResponseNotStoredError` naming ``reason``."""
        if not isinstance(reason, str) or not reason:
            raise ConfigError("complete_without_response needs the reason as a non-empty str")
        completion = self._lifecycle.completion_without_response(self._held.lease, reason[:300])
        await self._write(completion, None)

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
        # Bounded by the lease as last renewed (renewal stops once the cutoff is closed).
        written = await self._lifecycle.complete_held(
            self._flight, self._held.lease, completion, result, self._loop, self._started
        )
        self.stored = written is Written.RESPONSE  # what the store kept, not what was sent


class Unprotected(Call):
    """The handle of a call run without idempotency (no key): completing writes nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        self.answered = False
        self.stored = False
        self.released = None

    @property
    def key(self) -> str:
        return ""

    async def _write(self, completion: Completion | None, result: Any) -> None:
        self.answered = True

    async def complete(self, result: Any) -> None:
        await self._write(None, result)

    async def complete_without_response(self, reason: str) -> None:
        await self._write(None, None)


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
        "recorded; renew more often (Options(renew_every=...)) or give renew_lease more slack",
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
