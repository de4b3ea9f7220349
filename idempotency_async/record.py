"""The record model shared by every store.

Timeline of one key (``expiration`` in seconds, the lease in milliseconds, as the
TypeScript port writes them)::

    claim ──── callback runs ──── complete ─────────────── expiration
      │<──────── lease ────────>│                              │
      INPROGRESS: a second claim   COMPLETED: replayed until     gone: the next
      fails until the lease ends   the record expires            call runs again

A claim succeeds when no record exists, the record has expired, or it is
INPROGRESS and its lease has ended (the holder crashed or ran out of time).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, TypeAlias

__all__ = ["JSONValue", "Status", "Record", "Claim", "Completion"]

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
    lease_end: int | None = None
    """Unix time in milliseconds when an INPROGRESS claim lapses (``in_progress_expiration``)."""
    validation: str | None = None
    owner: str | None = None
    """Random token of the claim that wrote the record; ``None`` for foreign writers."""
    response: JSONValue = None
    response_stored: bool = True
    """False when the call succeeded but its response was too large or not encodable."""

    def is_expired(self, now: float) -> bool:
        return self.expiration < now

    def lease_lapsed(self, now: float) -> bool:
        return (
            self.status is Status.INPROGRESS
            and self.lease_end is not None
            and self.lease_end < now * 1000
        )

    def is_claimable(self, now: float) -> bool:
        """Whether a claim at ``now`` (Unix seconds) should succeed against this record."""
        return self.is_expired(now) or self.lease_lapsed(now)


class Claim(NamedTuple):
    """What a store writes to claim a key: an INPROGRESS record owned by ``owner``."""

    key: str
    owner: str
    expiration: int
    lease_end: int
    validation: str | None = None

    def to_record(self) -> Record:
        return Record(
            key=self.key,
            status=Status.INPROGRESS,
            expiration=self.expiration,
            lease_end=self.lease_end,
            validation=self.validation,
            owner=self.owner,
        )


class Completion(NamedTuple):
    """What a store writes when the callback has returned: the COMPLETED record."""

    key: str
    owner: str
    expiration: int
    validation: str | None
    response: JSONValue
    response_stored: bool = True
    encoded: bytes | None = None
    """The response as compact JSON (UTF-8), when the manager has it; stores may reuse it."""

    def to_record(self) -> Record:
        return Record(
            key=self.key,
            status=Status.COMPLETED,
            expiration=self.expiration,
            validation=self.validation,
            owner=self.owner,
            response=self.response,
            response_stored=self.response_stored,
        )
