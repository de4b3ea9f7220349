"""The record model shared by every store.

Timeline of one key (every time a Unix time in seconds; the DynamoDB and Redis stores write
the lease end in milliseconds, as the TypeScript port does)::

    claim ──── callback runs ──── complete ─────────────── expiration
      │<──────── lease ────────>│                              │
      INPROGRESS: a second claim   COMPLETED: replayed until     gone: the next
      fails until the lease ends   the record expires            call runs again

A claim succeeds when no record exists, the record has expired, or it is INPROGRESS and
its lease has ended (the holder crashed or ran out of time) — or when the record is
INPROGRESS and carries the claim's own owner token: a claim whose answer was lost and
that the client sent again *is* that claim.

The manager sends durations (``lease``, ``ttl``) and its clock's ``now``; the store turns
them into instants by its own clock, or by ``now`` when it has none.  Expiry is
``ceil(now + ttl)`` and never earlier than the lease end.
"""

from __future__ import annotations

import enum
import math
from typing import Any, NamedTuple, TypeAlias

__all__ = ["Claim", "Completion", "JSONValue", "Record", "Status", "expiration_for"]

JSONValue: TypeAlias = Any
"""A JSON value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict``."""


class Status(enum.StrEnum):
    INPROGRESS = "INPROGRESS"
    COMPLETED = "COMPLETED"


# Immutable NamedTuples rather than frozen dataclasses: a claim, a completion and a record
# are built on every call, and a frozen dataclass costs three times as much to build.


class Record(NamedTuple):
    """One idempotency record as a store returns it (immutable)."""

    key: str
    status: Status
    expiration: int
    """Unix time in seconds after which the record counts as absent."""
    lease_end: float | None = None
    """Unix time in seconds when an INPROGRESS claim lapses (``None``: never, before expiry)."""
    validation: str | None = None
    owner: str | None = None
    """Random token of the claim that wrote the record; ``None`` for foreign writers."""
    response: JSONValue = None
    response_stored: bool = True
    """False when the call succeeded but its response was not stored (see ``not_stored``)."""
    not_stored: str | None = None
    """Why the response was not stored, when the writer said so."""
    steps: str | None = None
    """The recovery points of an INPROGRESS record (the steps its calls finished), as the
    JSON text the manager wrote (:class:`~idempotency_async.stores.base.StepWrite`);
    ``None`` when it holds none — every record written by a call that took no step."""

    def is_expired(self, now: float) -> bool:
        return self.expiration < now

    def lease_lapsed(self, now: float) -> bool:
        return (
            self.status is Status.INPROGRESS and self.lease_end is not None and self.lease_end < now
        )

    def is_claimable(self, now: float) -> bool:
        """Whether a claim at ``now`` (Unix seconds) succeeds against this record."""
        return self.is_expired(now) or self.lease_lapsed(now)


class Claim(NamedTuple):
    """What a store writes to claim a key: an INPROGRESS record owned by ``owner``."""

    key: str
    owner: str
    now: float
    """The manager's clock at the claim (Unix seconds); a store with a clock of its own
    (Redis ``TIME``) uses that instead."""
    lease: float
    """Seconds from ``now`` until the claim lapses."""
    ttl: float
    """Seconds from ``now`` until the record expires (``expires_after``)."""
    validation: str | None = None
    wait: float = math.inf
    """How long the claim may wait for a record another transaction holds locked, before it
    answers "in progress" (stores with row locks, Postgres): ``Options.wait``'s ``timeout``
    (``Wait.timeout``), else 0; the store also bounds it by ``lease``."""

    def to_record(self, now: float) -> Record:
        """The INPROGRESS record this claim writes when the store's clock reads ``now``."""
        return Record(
            key=self.key,
            status=Status.INPROGRESS,
            expiration=expiration_for(now, self.ttl, self.lease),
            lease_end=now + self.lease,
            validation=self.validation,
            owner=self.owner,
        )


class Completion(NamedTuple):
    """What a store writes once the callback has returned: the COMPLETED record."""

    key: str
    owner: str
    now: float
    ttl: float
    validation: str | None
    encoded: bytes | None
    """The response as compact JSON (UTF-8), encoded once by the manager; ``None`` means
    "completed without a response" (``not_stored`` says why)."""
    response: JSONValue = None
    """The JSON value ``encoded`` holds, for stores that write it natively."""
    not_stored: str | None = None

    @property
    def response_stored(self) -> bool:
        return self.encoded is not None

    def to_record(self, now: float) -> Record:
        return Record(
            key=self.key,
            status=Status.COMPLETED,
            expiration=expiration_for(now, self.ttl, 0.0),
            validation=self.validation,
            owner=self.owner,
            response=self.response,
            response_stored=self.encoded is not None,
            not_stored=self.not_stored,
        )


def expiration_for(now: float, ttl: float, lease: float) -> int:
    """A record's expiry: ``ceil(now + ttl)``, and never before its lease ends."""
    # ``max(ttl, lease)``, spelt out: the builtin parses its keywords on every call, which
    # costs more than the rest of this function (two expiries per call).
    return math.ceil(now + (lease if lease > ttl else ttl))
