"""An in-process store: the embedded default for examples, tests and single-process services."""

from __future__ import annotations

import dataclasses

from idempotency_async._codec import decode_json, encode_json
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import DEFAULT_MAX_RESPONSE_BYTES

__all__ = ["MemoryStore"]


class MemoryStore:
    """Keeps records in a dict, with the same expiry, lease and owner rules as shared stores.

    Every operation completes without awaiting, so each one is atomic on its event loop.
    Responses are kept encoded, so a replay is always an independent copy.  Expired
    records are removed lazily, when their key is next touched or on :meth:`purge`.
    """

    def __init__(self, *, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.max_response_bytes = max_response_bytes
        self._records: dict[str, tuple[Record, bytes | None]] = {}

    def __len__(self) -> int:
        return len(self._records)

    async def claim(self, claim: Claim, *, now: float) -> Record | None:
        current = self._records.get(claim.key)
        if current is not None and not current[0].is_claimable(now):
            return self._materialize(current)
        self._records[claim.key] = (claim.to_record(), None)
        return None

    async def get(self, key: str) -> Record | None:
        current = self._records.get(key)
        return None if current is None else self._materialize(current)

    async def complete(self, completion: Completion) -> bool:
        current = self._records.get(completion.key)
        if current is None or current[0].owner != completion.owner:
            return False
        encoded = None
        if completion.response_stored:
            encoded = completion.encoded or encode_json(completion.response)
        # The stored record never holds the caller's object: replays decode a fresh copy.
        record = Record(
            key=completion.key,
            status=Status.COMPLETED,
            expiration=completion.expiration,
            validation=completion.validation,
            owner=completion.owner,
            response_stored=completion.response_stored,
        )
        self._records[completion.key] = (record, encoded)
        return True

    async def release(self, key: str, owner: str | None) -> bool:
        current = self._records.get(key)
        if current is None:
            return True
        if owner is not None and current[0].owner != owner:
            return False
        del self._records[key]
        return True

    def purge(self, now: float) -> int:
        """Drop records that expired before ``now``; returns how many were dropped."""
        expired = [key for key, (record, _) in self._records.items() if record.is_expired(now)]
        for key in expired:
            del self._records[key]
        return len(expired)

    async def aclose(self) -> None:
        self._records.clear()

    @staticmethod
    def _materialize(entry: tuple[Record, bytes | None]) -> Record:
        record, encoded = entry
        if encoded is None:
            return record
        return dataclasses.replace(record, response=decode_json(encoded))

