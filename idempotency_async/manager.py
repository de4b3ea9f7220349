"""The Manager: runs a callback at most once per idempotency key and replays its result."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from idempotency_async._codec import decode_json, encode_json
from idempotency_async._cutoff import Cutoffs
from idempotency_async.cache import CachedResponse, LocalCache
from idempotency_async.canonical import canonical_bytes, digester, idempotency_key
from idempotency_async.deadlines import effective_deadline, reserve_for
from idempotency_async.errors import (
    AlreadyInProgressError,
    CompletionError,
    ConfigError,
    InconsistentStateError,
    KeyMissingError,
    LeaseLostError,
    PayloadError,
    PayloadValidationError,
    ResponseNotStoredError,
    ResponseTooLargeError,
)
from idempotency_async.events import Event, EventKind
from idempotency_async.options import Options, disabled_by_environment
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.selection import (
    PowertoolsFunctions,
    Selector,
    compile_expression,
    is_missing,
)
from idempotency_async.stores.base import Store

__all__ = ["Manager"]

T = TypeVar("T")

_log = logging.getLogger("idempotency_async")

_CLAIM_RETRIES = 2
_FIRST_POLL = 0.05
_MAX_POLL = 1.0


class _Keys(NamedTuple):
    key: str
    validation: str | None


class _Replayed(NamedTuple):
    """A claim that found the key completed: the value to return instead of running."""

    value: Any


class _Outcome(NamedTuple):
    """What a finished call leaves for in-process duplicates waiting on it."""

    record: Record
    encoded: bytes | None


@dataclass(slots=True)
class _Flight:
    """A call of this manager that holds a key right now (single flight): its keys, its
    deadline (loop time), the owner token it claims with, and what duplicates wait on.

    The future is created by the first duplicate that waits, so an uncontended call
    pays nothing for it.
    """

    keys: _Keys
    deadline: float | None
    owner: str
    lease_end: float | None = None
    future: asyncio.Future[_Outcome | None] | None = None
    waiters: int = 0

    def settle(self, outcome: _Outcome | None) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(outcome)


class Manager:
    """Runs each key's work at most once while its record lives, and replays the result.

    A manager snapshots its :class:`Options`, owns its local cache and its in-flight
    table; several managers may share one store with distinct key prefixes.
    """

    def __init__(self, store: Store, options: Options | None = None) -> None:
        self.store = store
        self.options = options if options is not None else Options()
        functions = self.options.jmespath_functions or PowertoolsFunctions()
        self._key_selector = Selector(
            compile_expression(self.options.event_key_jmespath, option="event_key_jmespath"),
            functions,
        )
        validation = compile_expression(
            self.options.payload_validation_jmespath, option="payload_validation_jmespath"
        )
        self._validation_selector = None if validation is None else Selector(validation, functions)
        self._prefix = self.options.resolved_prefix()
        self._cache = (
            LocalCache(self.options.local_cache_max_items) if self.options.use_local_cache else None
        )
        self._inflight: dict[str, _Flight] = {}
        # Owner tokens: random per manager, unique per claim, cheap to make.
        self._owner_prefix = secrets.token_hex(12) + "-"
        self._claims = itertools.count()
        self._hasher = digester(self.options.hash_function)
        self._strict_integers = self.options.integer_precision == "strict"
        self._cutoffs: Cutoffs | None = None
        self._warned_no_deadline = False
        self._disabled = disabled_by_environment()
        if self._disabled:
            _log.warning(
                "idempotency is disabled by POWERTOOLS_IDEMPOTENCY_DISABLED: "
                "callbacks run on every call",
                extra={"idempotency_prefix": self._prefix},
            )

    @property
    def key_prefix(self) -> str:
        return self._prefix

    # ------------------------------------------------------------------ public API

    def key_for(self, payload: Any) -> str | None:
        """The key :meth:`execute` would use for ``payload``, or None when it selects no key."""
        keys = self._derive(payload)
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
            raise ConfigError(
                "callback must be a zero-argument callable returning an awaitable, e.g. "
                f"lambda: charge(order); got {type(callback).__name__}"
            )
        if self._disabled:
            return await callback()
        keys = self._derive(payload)
        if keys is None:
            return await callback()
        loop = asyncio.get_running_loop()
        when = effective_deadline(loop, deadline=deadline, timeout=timeout)
        if self._cache is not None:
            entry = self._cache.get(keys.key, self.options.clock())
            if entry is not None:
                return self._cache_hit(entry, keys)  # type: ignore[no-any-return]
        while True:
            flight = self._inflight.get(keys.key)
            if flight is None:
                owner = f"{self._owner_prefix}{next(self._claims)}"
                return await self._own(_Flight(keys, when, owner), callback, loop)
            self._validate(flight.keys.validation, keys)
            if not self.options.wait:
                self._emit("rejected_in_progress", keys.key)
                raise AlreadyInProgressError(
                    f"key {keys.key} is being processed by another call in this process: retry "
                    "later, or set Options(wait=True) to wait for its result",
                    key=keys.key,
                    lease_end=flight.lease_end,
                )
            outcome = await self._join(flight, keys.key, when, loop)
            if outcome is not None:
                self._emit("joined", keys.key)
                return self._replay_outcome(outcome)  # type: ignore[no-any-return]

    async def release(self, key: str) -> None:
        """Delete the record of ``key`` whatever its state (operators: unstick a key).

        Dangerous: if the original call is still running, a retry will run the side
        effect a second time.
        """
        if self._cache is not None:
            self._cache.discard(key)
        await self.store.release(key, None)
        self._emit("released", key)

    def clear_cache(self) -> None:
        """Forget locally cached responses; the store is left alone."""
        if self._cache is not None:
            self._cache.clear()

    # ------------------------------------------------------------------ keys

    def _derive(self, payload: Any) -> _Keys | None:
        selected = self._key_selector.select(payload)
        if is_missing(selected, strict=self.options.strict_missing_key):
            if self.options.raise_on_no_key:
                raise KeyMissingError(
                    f"no idempotency key in the payload (event_key_jmespath="
                    f"{self.options.event_key_jmespath!r} selected nothing): send the field, or "
                    "unset raise_on_no_key to run such calls without idempotency"
                )
            _log.warning(
                "no idempotency key in the payload: running without idempotency",
                extra={"event_key_jmespath": str(self.options.event_key_jmespath)},
            )
            return None
        key = idempotency_key(self._prefix, self._hash(selected))
        validation = None
        if self._validation_selector is not None:
            validation = self._hash(self._validation_selector.select(payload))
        return _Keys(key, validation)

    def _hash(self, value: Any) -> str:
        if self.options.serialize_key is not None:
            text = self.options.serialize_key(value)
            data = text.encode() if isinstance(text, str) else text
        else:
            data = canonical_bytes(
                value,
                serializer=self.options.serializer or _model_serializer,
                strict_integers=self._strict_integers,
            )
        return self._hasher(data)

    def _validate(self, stored: str | None, keys: _Keys) -> None:
        if keys.validation is not None and stored is not None and stored != keys.validation:
            raise PayloadValidationError(
                f"key {keys.key} was used before with a different payload "
                f"(payload_validation_jmespath={self.options.payload_validation_jmespath!r}): "
                "use a new key for a new request",
                key=keys.key,
            )

    # ------------------------------------------------------------------ replay

    def _cache_hit(self, entry: CachedResponse, keys: _Keys) -> Any:
        self._validate(entry.record.validation, keys)
        self._emit("cache_hit", keys.key)
        return self._replay_outcome(_Outcome(entry.record, entry.encoded))

    def _replay_outcome(self, outcome: _Outcome) -> Any:
        record = outcome.record
        if not record.response_stored or outcome.encoded is None:
            raise _not_stored(record.key)
        return self._present(decode_json(outcome.encoded), record)

    def _replay_record(self, record: Record, flight: _Flight) -> Any:
        if not record.response_stored:
            flight.settle(_Outcome(record, None))
            raise _not_stored(record.key)
        encoded = None
        if flight.waiters or self._cache is not None:
            encoded = encode_json(record.response)
            flight.settle(_Outcome(record, encoded))
            if self._cache is not None:
                self._cache.put(record.key, CachedResponse(record, encoded))
        self._emit("replayed", record.key)
        return self._present(record.response, record)

    def _present(self, stored: Any, record: Record) -> Any:
        codec = self.options.response_codec
        response = stored if codec is None else codec.decode(stored)
        hook = self.options.response_hook
        return response if hook is None else hook(response, record)

    # ------------------------------------------------------------------ claim and run

    async def _own(
        self,
        flight: _Flight,
        callback: Callable[[], Awaitable[T]],
        loop: asyncio.AbstractEventLoop,
    ) -> T:
        """Hold the key in this process (single flight): claim it, run the callback, record it.

        The uncontended path — claim, callback, completion — awaits from this one frame: with
        thousands of calls in flight, every live coroutine frame is garbage-collector work.
        """
        key = flight.keys.key
        self._inflight[key] = flight
        try:
            now = self.options.clock()
            claim, cutoff = self._claim_for(flight, now, loop)
            flight.lease_end = claim.lease_end / 1000
            existing = await self.store.claim(claim, now=now)
            if existing is not None:
                if existing.status is Status.COMPLETED and not existing.is_claimable(now):
                    self._validate(existing.validation, flight.keys)  # the common replay
                    return self._replay_record(existing, flight)  # type: ignore[no-any-return]
                claimed = await self._contend(flight, existing, now, loop)
                if isinstance(claimed, _Replayed):
                    return claimed.value  # type: ignore[no-any-return]
                claim, cutoff = claimed
            self._emit("claimed", key)
            started = loop.time()
            timer = None if cutoff is None else self._cutoffs_of(loop).start(cutoff)
            try:
                result = await callback()
            except asyncio.CancelledError as exc:
                if timer is not None and timer.fired():
                    # Our own deadline: like a cancellation, no store write.  The record
                    # stays in progress until its lease ends, right at the deadline.
                    raise _cut_off(key) from exc
                raise
            except Exception as exc:
                await self._release_after_failure(claim, exc)
                raise
            finally:
                if timer is not None:
                    timer.close()
            completion = self._completion_for(claim, result)
            try:
                written = await self.store.complete(completion)
            except Exception as exc:
                raise _completion_failed(claim, result, exc) from exc
            self._completed(completion, written, result, flight, loop.time() - started)
            return result
        finally:
            if self._inflight.get(key) is flight:
                del self._inflight[key]
            flight.settle(None)

    async def _contend(
        self, flight: _Flight, existing: Record, now: float, loop: asyncio.AbstractEventLoop
    ) -> tuple[Claim, float | None] | _Replayed:
        """The claim met a record: replay it, wait for it, or claim again once it is free.

        Returns the claim written (and the callback's cutoff) or the result to replay.
        """
        raced = 0
        wait_until = 0.0  # set when the first in-progress answer makes us wait
        while True:
            if existing.is_claimable(now):
                raced += 1  # it expired between our clock and the store's answer
                if raced > _CLAIM_RETRIES:
                    raise InconsistentStateError(
                        f"key {flight.keys.key}: the store kept refusing a claim on a record "
                        "that had expired; check that every worker's clock is synchronised"
                    )
            else:
                if not wait_until and self.options.wait:
                    wait_until = loop.time() + self.options.wait_timeout
                    if flight.deadline is not None:
                        wait_until = min(wait_until, flight.deadline)
                if self._is_final(existing, flight.keys, wait_until - loop.time()):
                    return _Replayed(self._replay_record(existing, flight))
                polled = await self._poll(flight.keys, wait_until, loop)
                if polled is not None:
                    return _Replayed(self._replay_record(polled, flight))
                # the holder failed, or its lease lapsed: claim again
            now = self.options.clock()
            claim, cutoff = self._claim_for(flight, now, loop)
            flight.lease_end = claim.lease_end / 1000
            found = await self.store.claim(claim, now=now)
            if found is None:
                return claim, cutoff
            existing = found

    async def _poll(
        self, keys: _Keys, wait_until: float, loop: asyncio.AbstractEventLoop
    ) -> Record | None:
        """Read an in-progress record with bounded backoff until it completes (returned) or
        is gone or claimable (None).  Reads, not claim attempts: in DynamoDB a refused
        conditional write costs write capacity, a strongly consistent read a fifth of it."""
        delay = _FIRST_POLL
        while True:
            await asyncio.sleep(min(delay, max(wait_until - loop.time(), 0.0)))
            delay = min(delay * 2, _MAX_POLL)
            record = await self.store.get(keys.key)
            if record is None or record.is_claimable(self.options.clock()):
                return None
            if self._is_final(record, keys, wait_until - loop.time()):
                return record

    def _is_final(self, existing: Record, keys: _Keys, wait_left: float) -> bool:
        """True for a completed record to replay; False to poll an in-progress one again."""
        self._validate(existing.validation, keys)
        if existing.status is Status.COMPLETED:
            return True
        if not self.options.wait or wait_left <= 0:
            self._emit("rejected_in_progress", keys.key)
            raise AlreadyInProgressError(
                f"key {keys.key} is being processed by another call: retry after its lease "
                "ends, or set Options(wait=True, wait_timeout=...) to wait for its result",
                key=keys.key,
                lease_end=existing.lease_end / 1000 if existing.lease_end is not None else None,
            )
        return False

    def _claim_for(
        self, flight: _Flight, now: float, loop: asyncio.AbstractEventLoop
    ) -> tuple[Claim, float | None]:
        """The claim to write at ``now`` and the loop time at which the callback is cut off."""
        margin = self.options.lease_margin
        if flight.deadline is None:
            self._diagnose_no_deadline()
            lease = self.options.lease or self.options.expires_after
            cutoff = None
        else:
            lease = flight.deadline - loop.time()
            if lease <= 0:
                raise TimeoutError(
                    f"the deadline of key {flight.keys.key} passed before it was claimed"
                )
            cutoff = flight.deadline - reserve_for(lease)
        lease_end_ms = math.ceil((now + lease + margin) * 1000)
        expiration = max(int(now + self.options.expires_after), math.ceil(lease_end_ms / 1000))
        claim = Claim(
            flight.keys.key, flight.owner, expiration, lease_end_ms, flight.keys.validation
        )
        return claim, cutoff

    def _cutoffs_of(self, loop: asyncio.AbstractEventLoop) -> Cutoffs:
        cutoffs = self._cutoffs
        if cutoffs is None or cutoffs.loop is not loop:
            cutoffs = self._cutoffs = Cutoffs(loop)
        return cutoffs

    def _completion_for(self, claim: Claim, result: Any) -> Completion:
        stored, encoded = self._encode_result(claim.key, result)
        return Completion(
            key=claim.key,
            owner=claim.owner,
            expiration=int(self.options.clock() + self.options.expires_after),
            validation=claim.validation,
            response=stored if encoded is not None else None,
            response_stored=encoded is not None,
            encoded=encoded,
        )

    def _completed(
        self, completion: Completion, written: bool, result: Any, flight: _Flight, duration: float
    ) -> None:
        key = completion.key
        if not written:
            error = LeaseLostError(
                f"the lease of key {key} ended before the call finished and another worker "
                "claimed the key; its record was left intact. Give calls a deadline that covers "
                "their work. The result is on this error.",
                key=key,
                result=result,
            )
            self._emit("lease_lost", key, error=error)
            raise error
        if flight.waiters or self._cache is not None:
            record = completion.to_record()._replace(response=None)
            flight.settle(_Outcome(record, completion.encoded))
            if self._cache is not None and completion.encoded is not None:
                self._cache.put(key, CachedResponse(record, completion.encoded))
        self._emit("completed", key, duration=duration)

    def _encode_result(self, key: str, result: Any) -> tuple[Any, bytes | None]:
        """The JSON value to store and its encoding; no encoding means "response not stored"."""
        try:
            codec = self.options.response_codec
            stored = result if codec is None else codec.encode(result)
            encoded = encode_json(stored)
        except Exception as exc:  # a failing codec too: the side effect happened all the same
            self._not_stored(key, exc)
            return None, None
        limit = self.store.max_response_bytes
        if len(encoded) > limit:
            too_large = ResponseTooLargeError(
                f"the response is {len(encoded)} bytes, over the store's limit of {limit}",
                size=len(encoded),
                limit=limit,
            )
            self._not_stored(key, too_large)
            return None, None
        return stored, encoded

    def _not_stored(self, key: str, reason: Exception) -> None:
        # The side effect happened, so the record is completed (never deleted): replays
        # raise ResponseNotStoredError instead of running the callback again.  The event
        # carries why (ResponseTooLargeError, ResponseEncodingError, a codec's error).
        _log.warning(
            "response not stored: %s; duplicates of this key will get ResponseNotStoredError",
            reason,
            extra={"idempotency_key": key},
        )
        self._emit("response_not_stored", key, error=reason)

    async def _release_after_failure(self, claim: Claim, exc: BaseException) -> None:
        try:
            released = await self.store.release(claim.key, claim.owner)
        except Exception as release_exc:
            exc.add_note(
                f"idempotency-async: releasing key {claim.key} failed ({release_exc!r}); the key "
                "stays in progress until its lease ends"
            )
            self._emit("release_failed", claim.key, error=release_exc)
            return
        if released:
            self._emit("released", claim.key)
        else:
            self._emit("lease_lost", claim.key, error=exc)

    async def _join(
        self, flight: _Flight, key: str, deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> _Outcome | None:
        """Wait for the in-process holder of ``key``; None when it failed (claim again)."""
        limit = loop.time() + self.options.wait_timeout
        own_deadline_first = deadline is not None and deadline <= limit
        if deadline is not None:
            limit = min(limit, deadline)
        if flight.future is None:
            flight.future = loop.create_future()
        flight.waiters += 1
        try:
            async with asyncio.timeout_at(limit):
                # shield: one waiter giving up must not cancel the holder's future.
                return await asyncio.shield(flight.future)
        except TimeoutError:
            if own_deadline_first:
                raise
            raise AlreadyInProgressError(
                f"key {key} was still in progress after waiting {self.options.wait_timeout} s",
                key=key,
                lease_end=flight.lease_end,
            ) from None
        finally:
            flight.waiters -= 1

    # ------------------------------------------------------------------ diagnostics

    def _diagnose_no_deadline(self) -> None:
        if self._warned_no_deadline:
            return
        self._warned_no_deadline = True
        _log.warning(
            "idempotent calls of this manager run without a deadline: a crash leaves the key in "
            "progress for the whole lease (%s s). Pass timeout=, use `async with deadline(...)`, "
            "or set Options(lease=...)",
            self.options.lease or self.options.expires_after,
            extra={"idempotency_prefix": self._prefix},
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
        hook = self.options.on_event
        if hook is None:
            return
        try:
            hook(Event(kind, key, duration, error))
        except Exception:
            # Metrics must never change the outcome of a call.
            _log.exception("on_event hook failed", extra={"idempotency_event": kind})


def _cut_off(key: str) -> TimeoutError:
    return TimeoutError(
        f"the call for key {key} was cut off before its deadline, leaving time to record it; "
        "the key is claimable again once the deadline passes"
    )


def _completion_failed(claim: Claim, result: Any, exc: Exception) -> CompletionError:
    return CompletionError(
        f"the call for key {claim.key} succeeded but recording its result failed ({exc}); the "
        "result is on this error, and the key stays in progress until its lease ends",
        key=claim.key,
        result=result,
    )


def _not_stored(key: str) -> ResponseNotStoredError:
    return ResponseNotStoredError(
        f"the first call for key {key} succeeded, but its response was not stored (too large "
        "or not JSON), so it cannot be replayed: use a new key to run the request again",
        key=key,
    )


def _model_serializer(value: Any) -> Any:
    """Default hook for payload objects: pydantic models dump to JSON values (imported lazily)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise PayloadError(
        f"{type(value).__name__} in the payload is not JSON: convert it first, or pass "
        "Options(serializer=...) that turns it into JSON values"
    )
