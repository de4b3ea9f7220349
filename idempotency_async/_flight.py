"""Single flight: the calls of one manager that are claiming or holding a key right now.

A call counts as the key's holder only once the store confirmed its claim.  Until then a
duplicate in the same process waits for that answer — it may well be a replay of a
completed record, which every duplicate must get (never "in progress") — and then either
replays the same outcome, treats the call as a holder, or claims for itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from idempotency_async._downstream import Run
from idempotency_async._keys import Keys
from idempotency_async._lease import Lease
from idempotency_async.record import Record

__all__ = ["Flight", "Outcome", "Phase", "Waits", "wait_for"]


class Outcome(NamedTuple):
    """What a finished call leaves for in-process duplicates waiting on it."""

    record: Record
    encoded: bytes | None


class Phase(Enum):
    """Where one call of the single-flight table is; it only moves down this list."""

    CLAIMING = "claiming"
    """Its claim is sent and unanswered: it may yet turn out to be a replay."""
    HOLDING = "holding"
    """The store confirmed its claim: the key is in progress here."""
    SETTLED = "settled"
    """It ended; ``result`` is the outcome duplicates replay (None: look again)."""


# Module constants: reading an Enum member through its class costs about 4 times a global
# (Python 3.11), and every call goes through two or three of these.
_CLAIMING, _HOLDING, _SETTLED = Phase.CLAIMING, Phase.HOLDING, Phase.SETTLED


@dataclass(slots=True)
class Waits:
    """What the duplicates waiting on one call share: made by the first that waits, so an
    uncontended call holds one empty slot for it."""

    claim_answered: asyncio.Future[None] | None = None
    finished: asyncio.Future[None] | None = None
    count: int = 0
    """How many duplicates are waiting right now."""


@dataclass(slots=True)
class Flight(Run):
    """One call that claims or holds a key in this process — and, while its callback runs,
    the :class:`~idempotency_async._downstream.Run` downstream keys see (one object).

    ``waits.claim_answered`` resolves when its claim is answered for good (held, replayed,
    or the call gave up); ``waits.finished`` when the call settles.  They are created by
    the first duplicate that waits (:meth:`waited_on`), so an uncontended call pays nothing
    for them.
    """

    keys: Keys
    owner: str
    steps: object
    """Its recovery points (``_steps``): the lifecycle's shared ``Stepper``, the
    call's own ``Progress`` once it resumed or took a step."""
    phase: Phase = _CLAIMING
    lease: Lease | None = None
    """The call's one lease once its claim is confirmed (renewal moves it)."""
    waits: Waits | None = None
    result: Outcome | None = None
    sent: float = 0.0
    """When (loop time) its latest claim or read was sent: the remaining life a store
    reports in the answer counts from here (for the local cache)."""

    def waited_on(self) -> Waits:
        """What the duplicates waiting on this call share (made by the first)."""
        waits = self.waits
        if waits is None:
            waits = self.waits = Waits()
        return waits

    @property
    def key(self) -> str:
        return self.keys.key

    @property
    def lease_end(self) -> float | None:
        """Unix time (seconds, this process's clock) at which the held lease ends, as last
        renewed."""
        lease = self.lease
        return None if lease is None else lease.end

    def holding(self) -> bool:
        """Whether the key is in progress here (its claim confirmed, the call not ended)."""
        return self.phase is _HOLDING

    def hold(self, lease: Lease) -> None:
        self.phase = _HOLDING
        self.lease = lease
        waits = self.waits
        answered = None if waits is None else waits.claim_answered
        if answered is not None and not answered.done():
            answered.set_result(None)

    def settle(self, outcome: Outcome | None) -> None:
        """Record how the call ended (first settlement wins) and wake its duplicates."""
        if self.phase is _SETTLED:
            return
        self.phase = _SETTLED
        self.result = outcome
        waits = self.waits
        if waits is None:
            return
        for future in (waits.claim_answered, waits.finished):
            if future is not None and not future.done():
                future.set_result(None)


async def wait_for(future: asyncio.Future[object], limit: float) -> None:
    """Wait for ``future`` until loop time ``limit``; TimeoutError when it has not resolved.

    Shielded: a waiter that gives up (or is cancelled) must not cancel the holder's future.
    """
    async with asyncio.timeout_at(limit):
        await asyncio.shield(future)
