"""The Manager: runs a callback at most once per idempotency key and replays its result.

The lifecycle of one call reads top-down from :meth:`Manager.execute`;
each step calls into the module that owns it: key derivation (``_keys``), response
encoding and replay (``_responses``), single flight (``_flight``), cutoffs (``_cutoff``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, NoReturn, TypeVar

from idempotency_async._call import Call, Unprotected, own_call
from idempotency_async._callback import (
    ReturnedNotAwaitable,
    awaitable,
    checked,
    not_awaitable_error,
    not_awaitable_reason,
)
from idempotency_async._codec import decode_json, encode_json
from idempotency_async._cutoff import Cutoffs
from idempotency_async._downstream import Run
from idempotency_async._flight import Flight, Outcome, wait_for
from idempotency_async._keys import Keys, key_deriver
from idempotency_async._responses import (
    Responses,
    log_not_stored,
    not_stored_error,
    not_stored_reason,
)
from idempotency_async.cache import CachedResponse, LocalCache
from idempotency_async.deadlines import effective_deadline, reserve_for
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
)
from idempotency_async.events import Event, EventKind
from idempotency_async.instrumentation import Observer
from idempotency_async.options import Options, disabled_by_environment
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import CLAIMED, State, Store, Verdict, Written

__all__ = ["Manager"]

T = TypeVar("T")

_log = logging.getLogger("idempotency_async")

_CLAIM_RETRIES = 2
# Store errors that refuse a claim outright (the request, or the record it met, cannot be
# processed): nothing was written.  Any other failure may hide a claim that applied.
_REFUSALS = (StoreAccessDeniedError, StoreValidationError)
_FIRST_POLL = 0.05
_MAX_POLL = 1.0


class _Lease(NamedTuple):
    """A claim this call wrote, with its bounds in loop time."""

    claim: Claim
    cutoff_at: float
    """When the callback is cut off: the lease end less the completion reserve."""
    ends_at: float
    """When the lease ends; cleanup and completion writes are abandoned here."""
    reserve: float


class _Replayed(NamedTuple):
    """A claim that found the key completed: the value to return instead of running."""

    value: Any


class _Unanswered:
    """Another call's claim stayed unanswered for as long as a duplicate may wait."""


_UNANSWERED = _Unanswered()


class Manager:
    """Runs each key's work at most once while its record lives, and replays the result.

    A manager snapshots its :class:`Options`, owns its local cache and its in-flight
    table; several managers may share one store with distinct key prefixes.
    """

    def __init__(self, store: Store, options: Options | None = None) -> None:
        self.store = store
        self.options = options if options is not None else Options()
        _check_record_format(store, self.options)
        self._keys = key_deriver(self.options)
        self._responses = Responses(self.options)
        self._cache = (
            LocalCache(self.options.local_cache_max_items) if self.options.use_local_cache else None
        )
        self._inflight: dict[str, Flight] = {}
        # Owner tokens: random per manager, unique per claim, cheap to make.
        self._owner_prefix = secrets.token_hex(12) + "-"
        self._claims = itertools.count()
        self._cutoffs: Cutoffs | None = None
        # force_release: how many are under way, and when (loop time) the last one ended.
        # A cache fill for a request sent before then may hold the released record.
        self._releasing = 0
        self._released_at = -math.inf
        self._warned_no_deadline = False
        self._disabled = disabled_by_environment()
        telemetry = self.options.telemetry
        self._observer = None if telemetry is None else telemetry.bind(self._keys.prefix, store)
        # The store every round trip goes to: the observer's timing wrapper once calls
        # are observed.
        self._store = store
        if self._observer is not None:
            # Observed calls enter through the observer; unobserved ones keep the plain
            # method and pay no extra coroutine frame (a frame per call in flight is
            # garbage-collector work).
            self.execute = self._observed_execute  # type: ignore[method-assign]
        if self._disabled:
            _log.warning(
                "idempotency is disabled by POWERTOOLS_IDEMPOTENCY_DISABLED: "
                "callbacks run on every call",
                extra={"idempotency_prefix": self._keys.prefix},
            )

    @property
    def key_prefix(self) -> str:
        return self._keys.prefix

    # ------------------------------------------------------------------ public API

    def key_for(self, payload: Any) -> str | None:
        """The key :meth:`execute` would use for ``payload``, or None when it selects no key."""
        keys = self._keys.derive(payload)
        return None if keys is None else keys.key

    async def execute(
        self,
        payload: Any,
        callback: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> T:
        """Run ``callback`` once for this payload's key, or replay the stored result.

        ``timeout`` (seconds) and ``deadline`` (``loop.time()`` units) bound the call; with
        the ambient :func:`~idempotency_async.deadline`, the earliest wins and becomes the
        record's lease.  Cancellation propagates and leaves no store write behind.
        """
        if not callable(callback):
            raise _not_callable(callback)
        loop = asyncio.get_running_loop()
        when = effective_deadline(loop, deadline=deadline, timeout=timeout)
        keys = None if self._disabled else self._keys.derive(payload)
        if keys is None:
            try:
                return await self._unprotected(checked(callback), when, loop)
            except ReturnedNotAwaitable as returned:
                # A plain function given by mistake: it ran, and there is nothing to record.
                raise not_awaitable_error(returned.value, None) from None
        if self._cache is not None:
            entry = self._cache.get(keys.key, loop.time())
            if entry is not None:
                return self._cache_hit(entry, keys)  # type: ignore[no-any-return]
        while True:
            flight = self._inflight.get(keys.key)
            if flight is None:
                owner = f"{self._owner_prefix}{next(self._claims)}"
                return await self._own(Flight(keys, when, owner), callback, loop)
            outcome = await self._duplicate(flight, keys, when, loop)
            if isinstance(outcome, _Unanswered):
                # The other call's claim is still unanswered: ask the store ourselves.
                owner = f"{self._owner_prefix}{next(self._claims)}"
                return await self._own(Flight(keys, when, owner), callback, loop)
            if outcome is not None:
                self._keys.validate(outcome.record.validation, keys)
                self._emit("joined", keys.key)
                return self._replay_outcome(outcome)  # type: ignore[no-any-return]

    def _observed_execute(
        self,
        payload: Any,
        callback: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, T]:
        """``execute`` of a manager with telemetry: a plain function handing back the
        coroutine to await, so that while telemetry is inactive (no provider set) a call
        costs one test and no extra frame."""
        observer = self._observer
        if observer is not None and observer.active():
            return self._observed(observer, payload, callback, deadline, timeout)
        return Manager.execute(self, payload, callback, deadline=deadline, timeout=timeout)

    async def _observed(
        self,
        observer: Observer,
        payload: Any,
        callback: Callable[[], Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
    ) -> T:
        # Observing never stops once it started (providers are set once).
        self._store = observer.store
        if not callable(callback):
            raise _not_callable(callback)

        def run(observed: Callable[[], Awaitable[T]]) -> Awaitable[T]:
            return Manager.execute(self, payload, observed, deadline=deadline, timeout=timeout)

        # The observer awaits the callback's value itself: check it can be awaited first.
        return await observer.call(run, checked(callback))

    async def execute_call(
        self,
        payload: Any,
        callback: Callable[[Call], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> T:
        """As :meth:`execute`, for work that knows its answer before it has finished.

        ``callback(call)`` may complete the record while it goes on running, with
        ``await call.complete(result)`` (or ``call.complete_without_response(reason)``):
        that is its point of no return.  Up to it, the call is what ``execute`` is (cut off
        at the deadline, released if the callback raises).  After it, the deadline no longer
        applies and nothing the callback does can release the key: a later exception or
        cancellation propagates with the record completed.  A callback that returns without
        completing is completed with its return value, as with ``execute``.  Returns the
        callback's return value, or the replay of the stored result.
        """
        if not callable(callback):
            raise ConfigError(
                "callback must be a callable taking the Call and returning an awaitable; "
                f"got {type(callback).__name__}"
            )
        observer = self._observer
        if observer is None or not observer.active():
            return await self._execute_call(payload, callback, deadline, timeout)
        # Observed: the observer times a zero-argument callback, so hand it one that
        # calls ``callback`` with the Call the lifecycle passes in.
        self._store = observer.store
        handle: list[Call] = []

        def run(observed: Callable[[], Awaitable[T]]) -> Awaitable[T]:
            async def with_call(call: Call) -> T:
                handle.append(call)
                return await observed()

            return self._execute_call(payload, with_call, deadline, timeout)

        return await observer.call(run, lambda: awaitable(callback(handle[-1])))

    async def _execute_call(
        self,
        payload: Any,
        callback: Callable[[Call], Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
    ) -> T:
        loop = asyncio.get_running_loop()
        when = effective_deadline(loop, deadline=deadline, timeout=timeout)
        keys = None if self._disabled else self._keys.derive(payload)
        if keys is None:
            try:
                return await self._unprotected(checked(lambda: callback(Unprotected())), when, loop)
            except ReturnedNotAwaitable as returned:
                raise not_awaitable_error(returned.value, None) from None
        if self._cache is not None:
            entry = self._cache.get(keys.key, loop.time())
            if entry is not None:
                return self._cache_hit(entry, keys)  # type: ignore[no-any-return]
        while True:
            flight = self._inflight.get(keys.key)
            if flight is None:
                owner = f"{self._owner_prefix}{next(self._claims)}"
                return await own_call(self, Flight(keys, when, owner), callback, loop)
            outcome = await self._duplicate(flight, keys, when, loop)
            if isinstance(outcome, _Unanswered):
                # The other call's claim is still unanswered: ask the store ourselves.
                owner = f"{self._owner_prefix}{next(self._claims)}"
                return await own_call(self, Flight(keys, when, owner), callback, loop)
            if outcome is not None:
                self._keys.validate(outcome.record.validation, keys)
                self._emit("joined", keys.key)
                return self._replay_outcome(outcome)  # type: ignore[no-any-return]

    async def force_release(self, key: str) -> Record | None:
        """Delete the record of ``key`` whatever its state (operators: unstick a key).

        Returns the record deleted, if there was one.  Dangerous: if the original call is
        still running, a retry will run the side effect a second time.  This manager's local
        cache keeps no entry of the key, whatever replays ran meanwhile; other processes'
        local caches keep replaying the key until their entries expire.
        """
        cache = self._cache
        self._releasing += 1
        try:
            if cache is not None:
                cache.discard(key)
            deleted = await self._store.force_release(key)
        finally:
            # Replays whose requests were sent before now are not cached (see _fill).
            self._releasing -= 1
            self._released_at = asyncio.get_running_loop().time()
            if cache is not None:
                cache.discard(key)
        self._emit("released", key)
        return deleted

    def clear_cache(self) -> None:
        """Forget locally cached responses; the store is left alone."""
        if self._cache is not None:
            self._cache.clear()

    # ------------------------------------------------------------------ replay

    def _cache_hit(self, entry: CachedResponse, keys: Keys) -> Any:
        self._keys.validate(entry.record.validation, keys)
        self._emit("cache_hit", keys.key)
        return self._replay_outcome(Outcome(entry.record, entry.encoded))

    def _replay_outcome(self, outcome: Outcome) -> Any:
        if outcome.encoded is None:
            raise not_stored_error(outcome.record)
        return self._responses.present(decode_json(outcome.encoded), outcome.record)

    def _replay_record(self, verdict: Verdict, flight: Flight) -> Any:
        """Replay the COMPLETED record of ``verdict``, the answer to the request ``flight``
        sent last (at ``flight.sent``)."""
        record = verdict.record
        assert record is not None
        self._keys.validate(record.validation, flight.keys)
        if not record.response_stored:
            flight.settle(Outcome(record, None))
            raise not_stored_error(record)
        if flight.waiters or self._cache is not None:
            encoded = encode_json(record.response)
            flight.settle(Outcome(record, encoded))
            if self._cache is not None and verdict.expires_in is not None:
                self._fill(record, encoded, flight.sent, verdict.expires_in)
        self._emit("replayed", record.key)
        return self._responses.present(record.response, record)

    def _fill(self, record: Record, encoded: bytes, sent: float, life: float) -> None:
        """Cache a completed record for ``life`` seconds (as the store judged it) counted
        from ``sent``, on the loop's clock: never by comparing its expiration with this
        process's wall clock, which may be off the store's."""
        cache = self._cache
        if cache is None or self._releasing or sent <= self._released_at:
            # A force_release ran since the request was sent: the record may be gone.
            return
        cache.put(record.key, CachedResponse(record, encoded, sent + life))

    # ------------------------------------------------------------------ claim and run

    async def _own(
        self, flight: Flight, callback: Callable[[], Awaitable[T]], loop: asyncio.AbstractEventLoop
    ) -> T:
        """Claim the key, run the callback, record the result.

        The uncontended path — claim, callback, completion — awaits from this one frame: with
        thousands of calls in flight, every live coroutine frame is garbage-collector work.
        """
        key = flight.keys.key
        self._inflight[key] = flight
        try:
            lease = self._lease_for(flight, loop)
            try:
                verdict = await self._store.claim(lease.claim)
            except InconsistentStateError as exc:
                # The store could not read the record that blocked the claim: nothing
                # was written, so there is nothing to release.
                self._emit("record_unreadable", key, error=exc)
                raise
            except _REFUSALS:
                raise
            except Exception as exc:
                await self._release_unknown_claim(lease, exc, loop)
                raise
            if verdict is not CLAIMED:
                record = verdict.record if verdict.__class__ is Verdict else None
                if record is not None and verdict.state is State.COMPLETED:
                    return self._replay_record(verdict, flight)  # type: ignore[no-any-return]
                contended = await self._contend(flight, lease, verdict, loop)
                if isinstance(contended, _Replayed):
                    return contended.value  # type: ignore[no-any-return]
                lease = contended
            claim = lease.claim
            self._start_holding(flight, lease, loop)
            started = loop.time()
            cutoffs = self._cutoffs_of(loop)
            timer = cutoffs.start(lease.cutoff_at)
            run = Run(key)  # what downstream keys see while the callback runs
            try:
                try:
                    pending = callback()
                    if not hasattr(pending, "__await__"):
                        pending = awaitable(pending)  # a plain function: it has run already
                    result = await pending
                finally:
                    run.end()
            except ReturnedNotAwaitable as returned:
                timer.close()
                await self._complete_not_awaitable(flight, lease, returned, loop, started)
            except asyncio.CancelledError as exc:
                cut_off = timer.fired()
                timer.close()
                if cut_off:
                    # Our own cutoff: like a cancellation, no store write.  The record stays
                    # in progress until its lease ends, a reserve from now.
                    self._emit("cut_off", key)
                    raise _cut_off(key) from exc
                if timer.cancelled_elsewhere():
                    raise  # the caller was cancelled: no store write
                # A CancelledError the callback raised on its own is its own exception.
                await self._release_after_failure(lease, exc, loop)
                raise
            except Exception as exc:
                timer.close()  # only the callback runs under the cutoff
                if timer.cancelled_elsewhere():
                    # The caller was cancelled and the callback turned it into another
                    # exception: no store write after a cancellation.
                    raise asyncio.CancelledError from exc
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
            completion = self._completion_for(claim, result)
            # _write_completion, inline: a coroutine frame less on every first call.
            timer = cutoffs.start(max(lease.ends_at, loop.time() + lease.reserve))
            try:
                written = await self._store.complete(completion)
                if written.__class__ is not Written:
                    # Not an answer: whether (and what) it wrote is unknown.
                    raise StoreUnavailableError(
                        f"the store answered a completion of key {key} with {written!r}"
                    )
            except asyncio.CancelledError as exc:
                if timer.fired():
                    abandoned = TimeoutError("abandoned at the lease end")
                    raise _completion_failed(key, result, abandoned, unknown=True) from exc
                raise
            except Exception as exc:
                # Anything but a definite refusal may hide a write that applied.
                unknown = not isinstance(exc, _REFUSALS)
                raise _completion_failed(key, result, exc, unknown=unknown) from exc
            finally:
                timer.close()
            self._completed(completion, written, result, flight, loop.time() - started, sent)
            return result
        finally:
            if self._inflight.get(key) is flight:
                del self._inflight[key]
            flight.settle(None)

    def _lease_for(self, flight: Flight, loop: asyncio.AbstractEventLoop) -> _Lease:
        """The claim to write now, and the loop times that bound the callback and cleanup."""
        options = self.options
        started = loop.time()
        if flight.deadline is None:
            self._diagnose_no_deadline()
            left = options.lease or options.expires_after
        else:
            left = flight.deadline - started
            if left <= 0:
                raise DeadlineExceededError(
                    f"the deadline of key {flight.keys.key} passed before it was claimed",
                    key=flight.keys.key,
                )
        reserve = reserve_for(left, options.completion_reserve)
        flight.sent = started  # the claim goes out now: a verdict it brings counts from here
        claim = Claim(
            flight.keys.key,
            flight.owner,
            options.clock(),
            left + options.lease_margin,
            options.expires_after,
            flight.keys.validation,
        )
        return _Lease(claim, started + left - reserve, started + left, reserve)

    async def _acquire(self, flight: Flight, loop: asyncio.AbstractEventLoop) -> _Lease | _Replayed:
        """Claim the key for ``flight``: the lease it now holds, or the result to replay.

        ``_own`` does the same inline, a coroutine frame less on every first call.
        """
        lease = self._lease_for(flight, loop)
        verdict = await self._claim(lease, loop)
        if verdict is not CLAIMED:
            record = verdict.record if verdict.__class__ is Verdict else None
            if record is not None and verdict.state is State.COMPLETED:
                return _Replayed(self._replay_record(verdict, flight))
            contended = await self._contend(flight, lease, verdict, loop)
            if isinstance(contended, _Replayed):
                return contended
            lease = contended
        self._start_holding(flight, lease, loop)
        return lease

    def _start_holding(
        self, flight: Flight, lease: _Lease, loop: asyncio.AbstractEventLoop
    ) -> None:
        """The claim is confirmed: hold the key in this process, unless it came too late."""
        key = lease.claim.key
        flight.hold(lease.claim.now + lease.claim.lease - self.options.lease_margin)
        self._emit("claimed", key)
        if loop.time() >= lease.cutoff_at:
            # The claim was answered after the cutoff (a slow store): its lease may have
            # ended already, so the callback must not start.
            self._emit("cut_off", key)
            raise _cut_off(key)

    async def _claim(self, lease: _Lease, loop: asyncio.AbstractEventLoop) -> Verdict:
        try:
            return await self._store.claim(lease.claim)
        except InconsistentStateError as exc:
            self._emit("record_unreadable", lease.claim.key, error=exc)  # nothing written
            raise
        except _REFUSALS:
            raise
        except Exception as exc:
            await self._release_unknown_claim(lease, exc, loop)
            raise

    async def _release_unknown_claim(
        self, lease: _Lease, exc: BaseException, loop: asyncio.AbstractEventLoop
    ) -> None:
        """One owner-fenced release after a claim whose outcome is unknown (unavailable,
        throttled after a lost answer, an answer that is not one): the write may have
        applied, and without this release the key would stay blocked for the whole lease by
        a claim nobody holds.  A failed release is a note on ``exc``."""
        await self._release(lease, exc, loop)

    async def _contend(
        self,
        flight: Flight,
        lease: _Lease,
        verdict: Verdict,
        loop: asyncio.AbstractEventLoop,
    ) -> _Lease | _Replayed:
        """The claim met a record: replay it, wait for it, or claim again once it is free."""
        raced = 0
        wait_until: float | None = None
        while True:
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
                return lease
            if state is State.COMPLETED and record is not None:
                return _Replayed(self._replay_record(verdict, flight))
            if state is State.IN_PROGRESS and record is not None:
                self._keys.validate(record.validation, flight.keys)
                if wait_until is None:
                    wait_until = self._wait_limit(flight.deadline, loop)
                verdict, flight.sent = await self._poll(flight.keys, verdict, wait_until, loop)
                if verdict.state is State.COMPLETED:
                    continue
            else:
                # CLAIMABLE after a refused claim: it expired between the write and the
                # store's answer.
                raced += 1
                if raced > _CLAIM_RETRIES:
                    raise InconsistentStateError(
                        f"key {flight.keys.key}: the store kept refusing claims on a record it "
                        "judged claimable; check that every worker's clock is synchronised"
                    )
            lease = self._lease_for(flight, loop)
            verdict = await self._claim(lease, loop)

    async def _poll(
        self, keys: Keys, verdict: Verdict, wait_until: float, loop: asyncio.AbstractEventLoop
    ) -> tuple[Verdict, float]:
        """Read an in-progress record with bounded backoff until the store judges it
        completed or claimable; returns that verdict and when its read was sent.  Reads, not
        claim attempts: in DynamoDB a refused conditional write costs write capacity, a
        strongly consistent read a fifth of it."""
        delay = _FIRST_POLL
        started = loop.time()
        try:
            while True:
                left = wait_until - loop.time()
                if not self.options.wait or left <= 0:
                    self._reject(keys.key, verdict.retry_after)
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, _MAX_POLL)
                sent = loop.time()
                try:
                    verdict = await self._store.get(keys.key, now=self.options.clock())
                except InconsistentStateError as exc:
                    self._emit("record_unreadable", keys.key, error=exc)
                    raise
                if verdict.__class__ is not Verdict:
                    raise StoreUnavailableError(
                        f"the store answered a read of key {keys.key} with {verdict!r}, not a "
                        "verdict"
                    )
                if verdict.state is not State.IN_PROGRESS:
                    return verdict, sent
                if verdict.record is not None:
                    self._keys.validate(verdict.record.validation, keys)
        finally:
            if self._observer is not None:
                self._observer.waited(loop.time() - started)

    def _wait_limit(self, deadline: float | None, loop: asyncio.AbstractEventLoop) -> float:
        limit = loop.time() + self.options.wait_timeout
        return limit if deadline is None else min(limit, deadline)

    def _reject(self, key: str, retry_after: float | None) -> None:
        self._emit("rejected_in_progress", key)
        raise AlreadyInProgressError(
            f"key {key} is being processed by another call: retry after its lease ends, or "
            "set Options(wait=True, wait_timeout=...) to wait for its result",
            key=key,
            lease_end=None if retry_after is None else self.options.clock() + retry_after,
            retry_after=retry_after,
        )

    def _cutoffs_of(self, loop: asyncio.AbstractEventLoop) -> Cutoffs:
        cutoffs = self._cutoffs
        if cutoffs is None or cutoffs.loop is not loop:
            cutoffs = self._cutoffs = Cutoffs(loop)
        return cutoffs

    # ------------------------------------------------------------------ completion

    def _completion_for(self, claim: Claim, result: Any) -> Completion:
        encoded = self._responses.encode(result, self.store.max_response_bytes)
        reason = None
        if encoded.reason is not None:
            reason = not_stored_reason(encoded.reason)
            log_not_stored(claim.key, encoded.reason)
            self._emit("response_not_stored", claim.key, error=encoded.reason)
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

    async def _write_completion(
        self, lease: _Lease, completion: Completion, result: Any, loop: asyncio.AbstractEventLoop
    ) -> Written:
        """The completion write, abandoned at the lease end (or a reserve from now when the
        callback overran it): after that another worker may hold the key."""
        timer = self._cutoffs_of(loop).start(max(lease.ends_at, loop.time() + lease.reserve))
        try:
            written = await self._store.complete(completion)
            if written.__class__ is not Written:
                # Not an answer: whether (and what) it wrote is unknown.
                raise StoreUnavailableError(
                    f"the store answered a completion of key {completion.key} with {written!r}"
                )
            return written
        except asyncio.CancelledError as exc:
            if timer.fired():
                abandoned = TimeoutError("abandoned at the lease end")
                raise _completion_failed(completion.key, result, abandoned, unknown=True) from exc
            raise
        except Exception as exc:
            # Anything but a definite refusal may hide a write that applied.
            unknown = not isinstance(exc, _REFUSALS)
            raise _completion_failed(completion.key, result, exc, unknown=unknown) from exc
        finally:
            timer.close()

    def _completed(
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
            self._emit("lease_lost", key, error=error)
            raise error
        encoded = completion.encoded
        if written is Written.WITHOUT_RESPONSE and encoded is not None:
            # The store could not keep what the manager encoded (too large for it, or a
            # value it cannot hold; the store logs which, and its record says why): every
            # caller, here and in other processes, now gets ResponseNotStoredError.
            why = f"the store could not keep the response ({len(encoded)} bytes of JSON)"
            not_kept = ResponseNotStoredError(why, key=key, reason=why)
            log_not_stored(key, not_kept)
            self._emit("response_not_stored", key, error=not_kept)
            completion = completion._replace(encoded=None, response=None, not_stored=why)
            encoded = None
        if flight.waiters or self._cache is not None:
            record = completion.to_record(completion.now)
            flight.settle(Outcome(record, encoded))
            if self._cache is not None and encoded is not None:
                # The record lives expires_after from the completion, by the store's clock.
                self._fill(record, encoded, sent, completion.ttl)
        self._emit("completed", key, duration=duration)

    async def _complete_not_awaitable(
        self,
        flight: Flight,
        lease: _Lease,
        returned: ReturnedNotAwaitable,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> NoReturn:
        """The callback returned something that is not awaitable: it ran (a plain function),
        so the key is completed without a response, never released, and ConfigError raised."""
        claim = lease.claim
        error = not_awaitable_error(returned.value, claim.key)
        self._emit("response_not_stored", claim.key, error=error)
        completion = Completion(
            claim.key,
            claim.owner,
            self.options.clock(),
            self.options.expires_after,
            claim.validation,
            None,
            None,
            not_awaitable_reason(returned.value),
        )
        sent = loop.time()
        try:
            written = await self._write_completion(lease, completion, None, loop)
            self._completed(completion, written, None, flight, loop.time() - started, sent)
        except CompletionError as failed:
            raise error from failed
        raise error from None

    async def _release_after_failure(
        self, lease: _Lease, exc: BaseException, loop: asyncio.AbstractEventLoop
    ) -> None:
        released = await self._release(lease, exc, loop)
        if released is True:
            self._emit("released", lease.claim.key)
        elif released is False:
            self._emit("lease_lost", lease.claim.key, error=exc)

    async def _release(
        self, lease: _Lease, exc: BaseException, loop: asyncio.AbstractEventLoop
    ) -> bool | None:
        """Owner-fenced release, abandoned at the lease end; a failure becomes a note on
        ``exc`` (None returned), never the caller's outcome."""
        key = lease.claim.key
        timer = self._cutoffs_of(loop).start(max(lease.ends_at, loop.time() + lease.reserve))
        try:
            return await self._store.release(key, lease.claim.owner)
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
        exc.add_note(
            f"idempotency-async: releasing key {key} {why}; the key stays in progress until "
            "its lease ends"
        )
        self._emit("release_failed", key, error=failure)
        return None

    # ------------------------------------------------------------------ duplicates

    async def _duplicate(
        self, flight: Flight, keys: Keys, deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> Outcome | _Unanswered | None:
        """A call for a key another call of this process claims or holds.

        Returns the outcome to replay, None to look again (the other call failed), or
        ``_UNANSWERED`` when the other call's claim stayed unanswered as long as this one
        may wait.
        """
        if not flight.holding:
            # Its claim is unanswered, and may turn out to be a replay: wait for the answer.
            if flight.answered is None:
                flight.answered = loop.create_future()
            if not await self._wait_on(flight, flight.answered, keys.key, deadline, loop):
                return _UNANSWERED
            outcome = flight.result
            if flight.settled or not flight.holding:
                return outcome
        self._keys.validate(flight.keys.validation, keys)
        if not self.options.wait:
            retry_after = None
            if flight.lease_end is not None:
                retry_after = max(flight.lease_end - self.options.clock(), 0.0)
            self._reject(keys.key, retry_after)
        if flight.finished is None:
            flight.finished = loop.create_future()
        await self._wait_on(flight, flight.finished, keys.key, deadline, loop)
        return flight.result

    async def _wait_on(
        self,
        flight: Flight,
        future: asyncio.Future[Any],
        key: str,
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """Wait for ``future`` at most min(wait_timeout, own deadline) — own deadline only
        while the other call's claim is unanswered and waiting is off.  False when it did
        not resolve and the other call's claim is still unanswered."""
        if self.options.wait or flight.holding:
            limit = self._wait_limit(deadline, loop)
        else:
            limit = float("inf") if deadline is None else deadline
        flight.waiters += 1
        started = loop.time()
        try:
            await wait_for(future, limit)
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                raise DeadlineExceededError(
                    f"the deadline of key {key} passed while waiting for another call of this "
                    "process holding it",
                    key=key,
                ) from None
            if not flight.holding:
                return False
            retry_after = None
            if flight.lease_end is not None:
                retry_after = max(flight.lease_end - self.options.clock(), 0.0)
            self._emit("rejected_in_progress", key)
            raise AlreadyInProgressError(
                f"key {key} was still in progress after waiting {self.options.wait_timeout} s",
                key=key,
                lease_end=flight.lease_end,
                retry_after=retry_after,
            ) from None
        finally:
            flight.waiters -= 1
            if self._observer is not None:
                self._observer.waited(loop.time() - started)
        return True

    # ------------------------------------------------------------------ no key

    async def _unprotected(
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
            extra={"idempotency_prefix": self._keys.prefix},
        )

    def _emit(
        self,
        kind: EventKind,
        key: str,
        *,
        duration: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "idempotency %s", kind, extra={"idempotency_event": kind, "idempotency_key": key}
            )
        if self._observer is not None:
            self._observer.event(kind, key, duration, error)
        hook = self.options.on_event
        if hook is None:
            return
        try:
            hook(Event(kind, key, duration, error))
        except Exception:
            # Metrics must never change the outcome of a call.
            _log.exception("on_event hook failed", extra={"idempotency_event": kind})


def _check_record_format(store: Store, options: Options) -> None:
    # Powertools-format keys with TypeScript-format records (or the reverse) would be
    # records neither port can replay: a silent loss of state, refused up front.
    record_format = getattr(store, "record_format", None)
    if record_format is not None and record_format != options.key_format:
        raise ConfigError(
            f"the store writes {record_format!r} records but Options(key_format="
            f"{options.key_format!r}): use the same format on both, e.g. "
            f"{type(store).__name__}(..., record_format={options.key_format!r})"
        )


def _not_callable(callback: object) -> ConfigError:
    return ConfigError(
        "callback must be a zero-argument callable returning an awaitable, e.g. "
        f"lambda: charge(order); got {type(callback).__name__}"
    )


def _cut_off(key: str) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"the call for key {key} was cut off before its lease ended, leaving time to record "
        "it; nothing was recorded, and the key is claimable again once the lease ends",
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
