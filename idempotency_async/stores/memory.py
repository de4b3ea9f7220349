"""An in-process store: the embedded default for examples, tests and single-process services."""

from __future__ import annotations

import heapq
from math import ceil
from typing import Any, Final

from idempotency_async._json import decode_json
from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record, Status, expiration_for
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores.base import (
    CLAIMED,
    DEFAULT_MAX_RESPONSE_BYTES,
    Extended,
    Found,
    Stepped,
    StepWrite,
    Verdict,
    Written,
    judge,
)

__all__ = ["DEFAULT_MAX_RECORDS", "MemoryStore"]

DEFAULT_MAX_RECORDS = 100_000

# What was written last for a key, as a plain tuple (the cheapest object to build):
#   (status, owner, expiration, validation, now, lease)          in progress
#   (status, owner, expiration, validation, now, lease, steps, count)
#                                                                in progress, with steps
#   (status, owner, expiration, validation, encoded, not_stored) completed
# A released record with steps has no owner and the lease end _RELEASED (long past).
# An in-progress record keeps its claim's (or renewal's) ``now`` and ``lease`` — objects the
# caller holds anyway — and its lease end is their sum, computed when read: no float of
# its own per call in flight.  The response is kept encoded only: every read decodes an
# independent copy, and the caller's result object is not kept alive.
_Entry = tuple[Any, ...]

# Globals: an Enum member read through its class costs far more (Python 3.11).
_INPROGRESS = Status.INPROGRESS
_COMPLETED = Status.COMPLETED
_RELEASED = 1.0
"""The lease end of a released record with steps (as ``now``, with a zero lease): long
past on any clock, so any claim may resume it."""
_CLAIMABLE, _FOUND_COMPLETED = Found.CLAIMABLE, Found.COMPLETED
_NOTHING, _RESPONSE, _WITHOUT_RESPONSE = Written.NOTHING, Written.RESPONSE, Written.WITHOUT_RESPONSE
# ``Record(...)`` runs a Python-level ``__new__``; the tuple constructor, called as
# ``_tuple_new(Record, (every field, in order))``, does not: a replay reads one record.
_tuple_new: Final = tuple.__new__
_join: Final = b"".join


class MemoryStore:
    """Keeps records in a dict, with the same expiry, lease and owner rules as shared stores.

    Every operation completes without awaiting, so each one is atomic on its event loop;
    it judges by the ``now`` the manager passes.  It records steps (recovery points,
    :class:`~idempotency_async.stores.base.RecordsSteps`).  Memory is bounded by ``max_records``:
    expired records are dropped first (in order of expiry, whatever their TTLs), and when
    every record is still live a new claim is refused with ``StoreUnavailableError`` — a
    live record, in progress or completed, is never evicted.
    """

    def __init__(
        self,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_records: int = DEFAULT_MAX_RECORDS,
    ) -> None:
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise ConfigError(f"max_records must be an integer >= 1, got {max_records!r}")
        self.max_response_bytes = max_response_bytes
        self.max_records = max_records
        self._entries: dict[str, _Entry] = {}
        # The expiry of every write, as whole seconds: a heap of the distinct seconds, and
        # the keys written for each (a list slot per write, not an (expiration, key) tuple).
        # A queued key is stale once it was written again or deleted: a second that comes
        # drops its keys only if their records have expired (whichever write queued them),
        # and the queues are rebuilt when stale keys outnumber the live ones.
        self._expiry: list[int] = []
        self._due: dict[int, list[str]] = {}
        self._queued = 0
        # The second the last write queued its key for, and that second's list: writes
        # that expire in the same second share one int object and skip the lookup.  Reset
        # (0: no second) whenever lists are dropped or rebuilt.
        self._last_expiration = 0
        self._last_due: list[str] = []
        # A closed store's records are gone: answering "no record" would let a duplicate
        # run again, so every operation refuses (checked inline: a frame on every call).
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, claim: Claim) -> Verdict:
        if self._closed:
            raise closed_error("MemoryStore")
        # Unpacked once (a NamedTuple's field read is a slow attribute lookup in 3.11).
        key, owner, now, lease, ttl, validation, _ = claim
        current = self._entries.get(key)
        kept: _Entry | None = None
        if current is not None:
            if current[0] is _COMPLETED and current[2] >= now:
                # The common replay, judged as ``judge`` does, without its frame.
                return _tuple_new(
                    Verdict, (_FOUND_COMPLETED, _record(key, current), None, current[2] - now)
                )
            if not (current[0] is _INPROGRESS and current[1] == owner):
                verdict = judge(_record(key, current), now)
                if verdict.found is not _CLAIMABLE:
                    return verdict
            if len(current) > 6 and current[2] >= now:
                # Unexpired progress: resumed by its own payload only.
                if current[3] != validation:
                    return Verdict(Found.RESUMABLE, _record(key, current))
                kept = current
        if self._expiry and self._expiry[0] < now:
            self._drop_expired(now)
        if current is None and len(self._entries) >= self.max_records:
            raise StoreUnavailableError(
                f"MemoryStore is full: {self.max_records} live records (max_records). Raise "
                "max_records, shorten expires_after, or use a shared store"
            )
        # ``expiration_for(now, ttl, lease)``, inlined (a frame on every write):
        expiration = ceil(now + (lease if lease > ttl else ttl))
        if kept is None:
            self._write(key, _INPROGRESS, owner, expiration, validation, now, lease)
            return CLAIMED
        self._write(key, _INPROGRESS, owner, expiration, validation, now, lease, kept[6:])
        return Verdict(Found.CLAIMED, _record(key, self._entries[key]))

    async def get(self, key: str, *, now: float) -> Verdict:
        if self._closed:
            raise closed_error("MemoryStore")
        current = self._entries.get(key)
        return judge(None if current is None else _record(key, current), now)

    async def complete(self, completion: Completion) -> Written:
        if self._closed:
            raise closed_error("MemoryStore")
        key, owner, now, ttl, validation, encoded, _, not_stored = completion  # (as in claim)
        current = self._entries.get(key)
        if current is None or current[1] != owner:
            return _NOTHING
        if encoded is None and current[0] is _COMPLETED and current[4] is not None:
            # The owner's response is final: its first completion (without one), resent
            # after its answer was lost, must not take back the response attached since.
            return _RESPONSE
        if encoded is not None:
            # orjson's bytes keep their whole output buffer (4 KB and up): an exact-size
            # copy keeps a record near the size of its response.  Joined to nothing: a join
            # of two always builds a new object, for a third of ``bytes(memoryview(...))``.
            encoded = _join((encoded, b""))
        expiration = ceil(now + (0.0 if ttl < 0.0 else ttl))  # (as in claim)
        self._write(key, _COMPLETED, owner, expiration, validation, encoded, not_stored)
        return _WITHOUT_RESPONSE if encoded is None else _RESPONSE

    async def release(self, key: str, owner: str) -> bool:
        if self._closed:
            raise closed_error("MemoryStore")
        current = self._entries.get(key)
        if current is None:
            return True
        if current[1] != owner:
            return current[1] is None and len(current) > 6  # released already
        if len(current) > 6:
            # Progress is kept: the record is released (no owner, its lease long past).
            status, _, expiration, validation = current[:4]
            self._write(key, status, None, expiration, validation, _RELEASED, 0.0, current[6:])
            return True
        del self._entries[key]
        return True

    async def extend(self, claim: Claim) -> Extended:
        if self._closed:
            raise closed_error("MemoryStore")
        key, now = claim.key, claim.now
        current = self._entries.get(key)
        if current is None or current[0] is not _INPROGRESS or current[1] != claim.owner:
            return Extended.LOST
        end = now + claim.lease
        if current[4] + current[5] > end:
            return Extended.ALREADY_LATER  # never backwards: a newer renewal landed first
        expiration = expiration_for(now, claim.ttl, claim.lease)
        self._write(
            key, _INPROGRESS, claim.owner, expiration, current[3], now, claim.lease, current[6:]
        )
        return Extended.RENEWED

    async def record_step(self, write: StepWrite) -> Stepped:
        if self._closed:
            raise closed_error("MemoryStore")
        key = write.key
        current = self._entries.get(key)
        if current is None or current[0] is not _INPROGRESS or current[1] != write.owner:
            return Stepped.LOST
        held = current[6:]
        if held and held[0] == write.steps:
            return Stepped.RECORDED  # this write, sent again
        if (held[1] if held else 0) != write.position:
            return Stepped.LOST
        if len(write.steps.encode("utf-8", "surrogatepass")) > self.max_response_bytes:
            return Stepped.TOO_LARGE
        now, lease = current[4], current[5]
        expiration = max(current[2], expiration_for(write.now, write.ttl, now + lease - write.now))
        self._write(
            key,
            _INPROGRESS,
            write.owner,
            expiration,
            current[3],
            now,
            lease,
            (write.steps, write.position + 1),
        )
        return Stepped.RECORDED

    async def force_release(self, key: str) -> Record | None:
        if self._closed:
            raise closed_error("MemoryStore")
        current = self._entries.pop(key, None)
        return None if current is None else _record(key, current)

    def purge(self, now: float) -> int:
        """Drop records that expired before ``now``; returns how many were dropped."""
        before = len(self._entries)
        self._drop_expired(now)
        return before - len(self._entries)

    async def aclose(self) -> None:
        """Drop every record; the store refuses use afterwards, as shared stores do."""
        self._closed = True
        self._entries.clear()
        self._expiry.clear()
        self._due.clear()
        self._last_expiration = 0
        self._queued = 0

    def _write(
        self,
        key: str,
        status: Status,
        owner: str | None,
        expiration: int,
        validation: str | None,
        fifth: Any,
        sixth: Any,
        steps: tuple[Any, ...] = (),
    ) -> None:
        """Write the entry ``(status, owner, expiration, validation, fifth, sixth)`` (the
        last two: ``now`` and ``lease`` in progress, ``encoded`` and ``not_stored``
        completed), followed by ``steps`` (the step list and its count, in progress), and
        queue its expiry."""
        if expiration == self._last_expiration:
            expiration = self._last_expiration
            due = self._last_due
        else:
            known = self._due.get(expiration)
            if known is None:
                known = self._due[expiration] = []
                heapq.heappush(self._expiry, expiration)
            due = self._last_due = known
            self._last_expiration = expiration
        if steps:
            self._entries[key] = (status, owner, expiration, validation, fifth, sixth, *steps)
        else:  # the common case, without building from an unpacking
            self._entries[key] = (status, owner, expiration, validation, fifth, sixth)
        due.append(key)
        self._queued += 1
        if self._queued > 2 * len(self._entries) + 64:
            self._due = {}
            self._last_expiration = 0
            for live, entry in self._entries.items():
                self._due.setdefault(entry[2], []).append(live)
            self._expiry = list(self._due)
            heapq.heapify(self._expiry)
            self._queued = len(self._entries)

    def _drop_expired(self, now: float) -> None:
        heap, due, entries = self._expiry, self._due, self._entries
        self._last_expiration = 0  # its list may be dropped here
        while heap and heap[0] < now:
            keys = due.pop(heapq.heappop(heap))
            self._queued -= len(keys)
            for key in keys:
                current = entries.get(key)
                if current is not None and current[2] < now:
                    del entries[key]


def _record(key: str, entry: _Entry) -> Record:
    status, owner, expiration, validation, fifth, sixth = entry[:6]
    if status is _INPROGRESS:
        lease_end, encoded, not_stored = fifth + sixth, None, None
    else:
        lease_end, encoded, not_stored = None, fifth, sixth
    return _tuple_new(
        Record,
        (
            key,
            status,
            expiration,
            lease_end,
            validation,
            owner,
            None if encoded is None else decode_json(encoded),
            status is _INPROGRESS or encoded is not None,
            not_stored,
            entry[6] if len(entry) > 6 else None,
        ),
    )
