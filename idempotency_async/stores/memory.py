"""An in-process store: the embedded default for examples, tests and single-process services."""

from __future__ import annotations

from idempotency_async._codec import decode_json, encode_json
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import DEFAULT_MAX_RESPONSE_BYTES

__all__ = ["MemoryStore"]

# What was written last for a key: the claim (in progress) or the completion.  Records are
# built only when read, and a completion keeps its response encoded, so a replay always
# decodes an independent copy and never shares the caller's object.
_Entry = tuple[Claim | Completion, bytes | None]


class MemoryStore:
    """Keeps records in a dict, with the same expiry, lease and owner rules as shared stores.

    Every operation completes without awaiting, so each one is atomic on its event loop.
    Memory stays bounded: records are kept in the order of their last write, which is the
    order they expire in for one TTL, and each claim drops up to two expired records from
    the front (with mixed TTLs a long-lived record delays the ones behind it until it
    expires).  :meth:`purge` drops every expired record at once.
    """

    def __init__(self, *, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.max_response_bytes = max_response_bytes
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, claim: Claim, *, now: float) -> Record | None:
        entries = self._entries
        current = entries.get(claim.key)
        if current is not None:
            if not _claimable(current[0], now):
                return _record(current)
            del entries[claim.key]  # re-inserted at the end: the order of expiry
        entries[claim.key] = (claim, None)
        self._drop_expired(now)
        return None

    async def get(self, key: str) -> Record | None:
        current = self._entries.get(key)
        return None if current is None else _record(current)

    async def complete(self, completion: Completion) -> bool:
        current = self._entries.get(completion.key)
        if current is None or current[0].owner != completion.owner:
            return False
        encoded = None
        if completion.response_stored:
            encoded = completion.encoded or encode_json(completion.response)
        # Keep the encoding only: holding the caller's result object too would double the
        # memory of every record and let later changes to it reach nobody.
        kept = Completion(
            completion.key,
            completion.owner,
            completion.expiration,
            completion.validation,
            None,
            completion.response_stored,
        )
        del self._entries[completion.key]  # its expiry moved: to the end
        self._entries[completion.key] = (kept, encoded)
        return True

    async def release(self, key: str, owner: str | None) -> bool:
        current = self._entries.get(key)
        if current is None:
            return True
        if owner is not None and current[0].owner != owner:
            return False
        del self._entries[key]
        return True

    def _drop_expired(self, now: float) -> None:
        # Two per claim outpaces one insert per claim, so expired records cannot pile up.
        entries = self._entries
        for _ in range(2):
            oldest = next(iter(entries))
            if entries[oldest][0].expiration >= now:
                return
            del entries[oldest]

    def purge(self, now: float) -> int:
        """Drop records that expired before ``now``; returns how many were dropped."""
        expired = [key for key, (written, _) in self._entries.items() if written.expiration < now]
        for key in expired:
            del self._entries[key]
        return len(expired)

    async def aclose(self) -> None:
        self._entries.clear()


def _claimable(written: Claim | Completion, now: float) -> bool:
    if written.expiration < now:
        return True
    return isinstance(written, Claim) and written.lease_end < now * 1000


def _record(entry: _Entry) -> Record:
    written, encoded = entry
    if isinstance(written, Claim):
        return written.to_record()
    return Record(
        key=written.key,
        status=Status.COMPLETED,
        expiration=written.expiration,
        validation=written.validation,
        owner=written.owner,
        response=None if encoded is None else decode_json(encoded),
        response_stored=written.response_stored,
    )
