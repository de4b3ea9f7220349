"""Where a lifecycle writes: the store (:class:`Plain`), or a caller's database transaction
(:class:`InTransaction`).  Chosen once, when the lifecycle is built; the lifecycle calls
the one small interface (:class:`Mode`) and never asks which it has.

A transactional call's store is the caller's transaction: nothing may learn its result
before the caller commits, so it publishes nothing (no local cache, no single flight: a
duplicate in this process waits on the row like any other), needs no deadline (the row
lock holds the key), and undoes its claim — rolls its savepoint back — where a plain call
would leave the record to its lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Final, Protocol

from idempotency_async._cutoff import Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._flight import Flight, Outcome
from idempotency_async._keys import KeyDeriver
from idempotency_async._lease import Lease
from idempotency_async._renewal import DONE, FixedLeases, Leases, RenewedLeases
from idempotency_async._responses import Replays
from idempotency_async._waiting import Waiting
from idempotency_async.options import Options
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Store, Verdict

__all__ = ["InTransaction", "Mode", "Plain", "TransactionalStore"]

_log = logging.getLogger("idempotency_async")


class TransactionalStore(Store, Protocol):
    """A store whose operations run in a caller's database transaction (Postgres): a claim
    waits on the row another open transaction holds, for at most ``wait`` seconds."""

    async def claim_within(self, claim: Claim, wait: float) -> Verdict: ...


class Mode(Protocol):
    """What differs between a plain call and a transactional one."""

    store: Store
    leases: Leases
    replays: Replays
    records_steps: bool
    """Whether its calls record their steps (a transaction commits as a whole: no)."""

    def claim(self, lease: Lease, loop: asyncio.AbstractEventLoop) -> Awaitable[Verdict]:
        """Send the claim of ``lease`` (the store's own awaitable: no frame of its own)."""

    def without_deadline(self) -> None:
        """A claim is about to go out for a call without a deadline."""

    def unknown_claim(self, lease: Lease, exc: BaseException, cutoffs: Cutoffs) -> Awaitable[None]:
        """The claim's outcome is unknown (it may have applied): clean up after it."""

    def abandon(self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs) -> Awaitable[None]:
        """The call is cut off: what is left of its claim (the record waits for its lease)."""

    def release(
        self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs
    ) -> Awaitable[bool | None]:
        """Owner-fenced release, bounded; a failure is a note on ``exc`` (None returned)."""

    def publish(
        self, flight: Flight, completion: Completion, encoded: bytes | None, sent: float
    ) -> bool:
        """Let this process learn the completed result; False when nothing may yet."""


class Plain:
    """Calls on the store: single flight and the local cache learn each result."""

    records_steps = True

    def __init__(
        self,
        store: Store,
        options: Options,
        keys: KeyDeriver,
        emitter: Emitter,
        replays: Replays,
    ) -> None:
        self.store = store
        self.replays = replays
        self._options = options
        self._keys = keys
        self._emitter = emitter
        self._warned_no_deadline = False
        self.leases: Leases = (
            FixedLeases() if options.renewal is None else RenewedLeases(store, options, emitter)
        )

    def claim(self, lease: Lease, loop: asyncio.AbstractEventLoop) -> Awaitable[Verdict]:
        return self.store.claim(lease.claim)

    def without_deadline(self) -> None:
        if not self._warned_no_deadline:
            self._warned_no_deadline = True
            options = self._options
            _log.warning(
                "idempotent calls of this manager run without a deadline: each callback is "
                "cut off before its lease of %s s ends, and a crash leaves the key in "
                "progress that long. Pass timeout=, use `async with deadline(...)`, or set "
                "Options(lease=...)",
                options.lease or options.expires_after,
                extra={"idempotency_prefix": self._keys.prefix},
            )

    def unknown_claim(self, lease: Lease, exc: BaseException, cutoffs: Cutoffs) -> Awaitable[None]:
        # Without this owner-fenced release the key would stay blocked for the whole lease
        # by a claim nobody holds; it deletes nothing but this claim's record.
        return self._released(lease, exc, cutoffs)

    async def _released(self, lease: Lease, exc: BaseException, cutoffs: Cutoffs) -> None:
        await self.release(lease, exc, cutoffs)

    def abandon(self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs) -> Awaitable[None]:
        return DONE  # the record stays in progress until its lease ends

    def release(
        self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs
    ) -> Awaitable[bool | None]:
        bound = lease.write_bound(cutoffs.loop.time())
        return _release(self.store, self._emitter, lease, cutoffs, bound, exc, _RELEASE_NOTE)

    def publish(
        self, flight: Flight, completion: Completion, encoded: bytes | None, sent: float
    ) -> bool:
        replays = self.replays
        if flight.waits is not None or replays.cache is not None:
            record = completion.to_record(completion.now)
            flight.settle(Outcome(record, encoded))
            if replays.cache is not None and encoded is not None:
                # The record lives expires_after from the completion, by the store's clock.
                replays.fill(record, encoded, sent, completion.ttl)
        return True


class InTransaction:
    """Calls in a caller's transaction: nothing learns the result before its COMMIT."""

    records_steps = False

    def __init__(
        self, store: TransactionalStore, waiting: Waiting, emitter: Emitter, replays: Replays
    ) -> None:
        self.store: Store = store
        self._transaction = store
        self._waiting = waiting
        self._emitter = emitter
        self.replays = replays
        self.leases: Leases = FixedLeases()  # the row lock holds the key: nothing to renew

    def claim(self, lease: Lease, loop: asyncio.AbstractEventLoop) -> Awaitable[Verdict]:
        wait = self._waiting.lock_wait(lease.cutoff_at, loop)
        return self._transaction.claim_within(lease.claim, wait)

    def without_deadline(self) -> None:
        pass  # a transaction's row lock needs no deadline

    def unknown_claim(self, lease: Lease, exc: BaseException, cutoffs: Cutoffs) -> Awaitable[None]:
        return DONE  # a transactional claim rolled its savepoint back itself

    async def abandon(self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs) -> None:
        # Nothing is left half done in the caller's transaction: its savepoint rolls back.
        await self.release(lease, exc, cutoffs)

    def release(
        self, lease: Lease, exc: BaseException | None, cutoffs: Cutoffs
    ) -> Awaitable[bool | None]:
        # A claim left in the caller's transaction makes the table's guard refuse its COMMIT.
        bound = lease.undo_bound(cutoffs.loop.time())
        return _release(self.store, self._emitter, lease, cutoffs, bound, exc, _UNDO_NOTE)

    def publish(
        self, flight: Flight, completion: Completion, encoded: bytes | None, sent: float
    ) -> bool:
        return False  # nothing learns the result before the caller's COMMIT


_RELEASE_NOTE: Final = (
    "idempotency-async: releasing key {key} {text}; the key stays in progress until its lease ends"
)
_UNDO_NOTE: Final = (
    "idempotency-async: undoing the transactional call of key {key} {text}; roll the "
    "transaction back (its COMMIT would be refused)"
)


async def _release(
    store: Store,
    emitter: Emitter,
    lease: Lease,
    cutoffs: Cutoffs,
    bound: float,
    exc: BaseException | None,
    note: str,
) -> bool | None:
    """The owner-fenced release of ``lease``, abandoned at ``bound`` (loop time): what the
    store answered, or None once it failed — said on ``exc`` (``note``, a template of
    ``key`` and ``text``) and as a ``release_failed`` event."""
    key = lease.key
    try:
        with cutoffs.at(bound) as cutoff:
            return await store.release(key, lease.owner)
    except asyncio.CancelledError as cancelled:
        if not cutoff.cut_off:
            raise
        failure: BaseException = cancelled
        text = "was abandoned at the lease end"
    except Exception as error:
        failure, text = error, f"failed ({error!r})"
    if exc is not None:
        exc.add_note(note.format(key=key, text=text))
    emitter.emit("release_failed", key, error=failure)
    return None
