"""An in-process store: the embedded default for examples, tests and single-process services."""

from __future__ import annotations

import heapq

from idempotency_async._json import decode_json
from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record, Status, expiration_for
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores.base import (
    CLAIMED,
    DEFAULT_MAX_RESPONSE_BYTES,
    Extended,
    Found,
    Verdict,
    Written,
    judge,
)

__all__ = ["DEFAULT_MAX_RECORDS", "MemoryStore"]

DEFAULT_MAX_RECORDS = 100_000

# What was written last for a key, as a plain tuple (the cheapest object to build):
#   (status, owner, expiration, lease_end, validation, encoded, not_stored)
# The response is kept encoded only: every read decodes an independent copy, and the
# caller's result object is not kept alive.
_Entry = tuple[Status, str, int, float | None, str | None, bytes | None, str | None]

_INPROGRESS = Status.INPROGRESS
_COMPLETED = Status.COMPLETED


class MemoryStore:
    """Keeps records in a dict, with the same expiry, lease and owner rules as shared stores.

    Every operation completes without awaiting, so each one is atomic on its event loop;
    it judges by the ``now`` the manager passes.  Memory is bounded by ``max_records``:
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
        # (expiration, key) of every write; an item is stale once its key was written again
        # or deleted.  A popped item drops its key only if the key's record has expired
        # (whichever write it came from), and the heap is rebuilt when stale items
        # outnumber the live ones.
        self._expiry: list[tuple[int, str]] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, claim: Claim) -> Verdict:
        self._refuse_if_closed()
        key, now = claim.key, claim.now
        current = self._entries.get(key)
        if current is not None and not (current[0] is _INPROGRESS and current[1] == claim.owner):
            verdict = judge(_record(key, current), now)
            if verdict.found is not Found.CLAIMABLE:
                return verdict
        if self._expiry and self._expiry[0][0] < now:
            self._drop_expired(now)
        if key not in self._entries and len(self._entries) >= self.max_records:
            raise StoreUnavailableError(
                f"MemoryStore is full: {self.max_records} live records (max_records). Raise "
                "max_records, shorten expires_after, or use a shared store"
            )
        expiration = expiration_for(now, claim.ttl, claim.lease)
        self._write(key, _INPROGRESS, claim.owner, expiration, now + claim.lease, claim.validation)
        return CLAIMED

    async def get(self, key: str, *, now: float) -> Verdict:
        self._refuse_if_closed()
        current = self._entries.get(key)
        return judge(None if current is None else _record(key, current), now)

    async def complete(self, completion: Completion) -> Written:
        self._refuse_if_closed()
        key = completion.key
        current = self._entries.get(key)
        if current is None or current[1] != completion.owner:
            return Written.NOTHING
        encoded = completion.encoded
        if encoded is None and current[0] is _COMPLETED and current[5] is not None:
            # The owner's response is final: its first completion (without one), resent
            # after its answer was lost, must not take back the response attached since.
            return Written.RESPONSE
        if encoded is not None:
            # orjson's bytes keep their whole output buffer (4 KB and up): an exact-size
            # copy keeps a record near the size of its response.
            encoded = bytes(memoryview(encoded))
        expiration = expiration_for(completion.now, completion.ttl, 0.0)
        self._write(
            key,
            _COMPLETED,
            completion.owner,
            expiration,
            None,
            completion.validation,
            encoded,
            completion.not_stored,
        )
        return Written.WITHOUT_RESPONSE if encoded is None else Written.RESPONSE

    async def release(self, key: str, owner: str) -> bool:
        self._refuse_if_closed()
        current = self._entries.get(key)
        if current is None:
            return True
        if current[1] != owner:
            return False
        del self._entries[key]
        return True

    async def extend(self, claim: Claim) -> Extended:
        self._refuse_if_closed()
        key, now = claim.key, claim.now
        current = self._entries.get(key)
        if current is None or current[0] is not _INPROGRESS or current[1] != claim.owner:
            return Extended.LOST
        end = now + claim.lease
        if current[3] is not None and current[3] > end:
            return Extended.ALREADY_LATER  # never backwards: a newer renewal landed first
        expiration = expiration_for(now, claim.ttl, claim.lease)
        self._write(key, _INPROGRESS, claim.owner, expiration, end, current[4])
        return Extended.RENEWED

    async def force_release(self, key: str) -> Record | None:
        self._refuse_if_closed()
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

    def _refuse_if_closed(self) -> None:
        # Its records are gone: answering "no record" would let a duplicate run again.
        if self._closed:
            raise closed_error("MemoryStore")

    def _write(
        self,
        key: str,
        status: Status,
        owner: str,
        expiration: int,
        lease_end: float | None,
        validation: str | None,
        encoded: bytes | None = None,
        not_stored: str | None = None,
    ) -> None:
        self._entries[key] = (status, owner, expiration, lease_end, validation, encoded, not_stored)
        heapq.heappush(self._expiry, (expiration, key))
        if len(self._expiry) > 2 * len(self._entries) + 64:
            self._expiry = [(entry[2], key) for key, entry in self._entries.items()]
            heapq.heapify(self._expiry)

    def _drop_expired(self, now: float) -> None:
        heap, entries = self._expiry, self._entries
        while heap and heap[0][0] < now:
            _, key = heapq.heappop(heap)
            current = entries.get(key)
            if current is not None and current[2] < now:
                del entries[key]


def _record(key: str, entry: _Entry) -> Record:
    status, owner, expiration, lease_end, validation, encoded, not_stored = entry
    return Record(
        key,
        status,
        expiration,
        lease_end,
        validation,
        owner,
        None if encoded is None else decode_json(encoded),
        status is _INPROGRESS or encoded is not None,
        not_stored,
    )
