"""An in-process store: the embedded default for examples, tests and single-process services."""

from __future__ import annotations

import heapq
import itertools

from idempotency_async._codec import decode_json
from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record, Status, expiration_for
from idempotency_async.stores.base import (
    CLAIMED,
    DEFAULT_MAX_RESPONSE_BYTES,
    State,
    Verdict,
    Written,
    judge,
)

__all__ = ["DEFAULT_MAX_RECORDS", "MemoryStore"]

DEFAULT_MAX_RECORDS = 100_000


class _Entry:
    """What was written last for a key.  The response is kept encoded only: every read
    decodes an independent copy, and the caller's result object is not kept alive."""

    __slots__ = (
        "encoded",
        "expiration",
        "lease_end",
        "not_stored",
        "owner",
        "seq",
        "status",
        "validation",
    )

    def __init__(
        self,
        status: Status,
        owner: str,
        expiration: int,
        lease_end: float | None,
        encoded: bytes | None,
        not_stored: str | None,
        validation: str | None,
        seq: int,
    ) -> None:
        self.status = status
        self.owner = owner
        self.expiration = expiration
        self.lease_end = lease_end
        self.encoded = encoded
        self.not_stored = not_stored
        self.validation = validation
        self.seq = seq


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
        # (expiration, seq, key) of every write; an item is stale once its key was written
        # again (another seq) or deleted.  Stale items are skipped, and the heap is rebuilt
        # when they outnumber the live ones.
        self._expiry: list[tuple[int, int, str]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, claim: Claim) -> Verdict:
        now = claim.now
        current = self._entries.get(claim.key)
        if current is not None and not (
            current.status is Status.INPROGRESS and current.owner == claim.owner
        ):
            verdict = judge(self._record(claim.key, current), now)
            if verdict.state is not State.CLAIMABLE:
                return verdict
        self._drop_expired(now)
        if claim.key not in self._entries and len(self._entries) >= self.max_records:
            raise StoreUnavailableError(
                f"MemoryStore is full: {self.max_records} live records (max_records). Raise "
                "max_records, shorten expires_after, or use a shared store"
            )
        self._write(
            claim.key,
            _Entry(
                Status.INPROGRESS,
                claim.owner,
                expiration_for(now, claim.ttl, claim.lease),
                now + claim.lease,
                None,
                None,
                claim.validation,
                next(self._seq),
            ),
        )
        return CLAIMED

    async def get(self, key: str, *, now: float) -> Verdict:
        current = self._entries.get(key)
        return judge(None if current is None else self._record(key, current), now)

    async def complete(self, completion: Completion) -> Written:
        current = self._entries.get(completion.key)
        if current is None or current.owner != completion.owner:
            return Written.NOTHING
        encoded = completion.encoded
        if encoded is not None:
            # orjson's bytes keep their whole output buffer (4 KB and up): an exact-size
            # copy keeps a record near the size of its response.
            encoded = bytes(memoryview(encoded))
        self._write(
            completion.key,
            _Entry(
                Status.COMPLETED,
                completion.owner,
                expiration_for(completion.now, completion.ttl, 0.0),
                None,
                encoded,
                completion.not_stored,
                completion.validation,
                next(self._seq),
            ),
        )
        return Written.WITHOUT_RESPONSE if encoded is None else Written.RESPONSE

    async def release(self, key: str, owner: str) -> bool:
        current = self._entries.get(key)
        if current is None:
            return True
        if current.owner != owner:
            return False
        self._delete(key)
        return True

    async def force_release(self, key: str) -> Record | None:
        current = self._entries.get(key)
        if current is None:
            return None
        record = self._record(key, current)
        self._delete(key)
        return record

    def purge(self, now: float) -> int:
        """Drop records that expired before ``now``; returns how many were dropped."""
        before = len(self._entries)
        self._drop_expired(now)
        return before - len(self._entries)

    async def aclose(self) -> None:
        self._entries.clear()
        self._expiry.clear()

    # -- internals ------------------------------------------------------------------

    def _write(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        heapq.heappush(self._expiry, (entry.expiration, entry.seq, key))
        if len(self._expiry) > 2 * len(self._entries) + 64:
            self._expiry = [
                (entry.expiration, entry.seq, key) for key, entry in self._entries.items()
            ]
            heapq.heapify(self._expiry)

    def _delete(self, key: str) -> None:
        del self._entries[key]

    def _drop_expired(self, now: float) -> None:
        heap, entries = self._expiry, self._entries
        while heap and heap[0][0] < now:
            _, seq, key = heapq.heappop(heap)
            current = entries.get(key)
            if current is not None and current.seq == seq:
                self._delete(key)

    def _record(self, key: str, entry: _Entry) -> Record:
        return Record(
            key=key,
            status=entry.status,
            expiration=entry.expiration,
            lease_end=entry.lease_end,
            validation=entry.validation,
            owner=entry.owner,
            response=None if entry.encoded is None else decode_json(entry.encoded),
            response_stored=entry.status is Status.INPROGRESS or entry.encoded is not None,
            not_stored=entry.not_stored,
        )
