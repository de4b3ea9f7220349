"""The async protocol every record store implements.

A store only stores: it never reads a clock (the manager passes ``now``), never
hashes, never decides what to replay.  Each method is one atomic operation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from idempotency_async.record import Claim, Completion, Record

__all__ = ["Store", "DEFAULT_MAX_RESPONSE_BYTES"]

DEFAULT_MAX_RESPONSE_BYTES = 350_000


@runtime_checkable
class Store(Protocol):
    max_response_bytes: int
    """Largest encoded (JSON, UTF-8) response this store accepts."""

    async def claim(self, claim: Claim, *, now: float) -> Record | None:
        """Write ``claim`` atomically if the key is free at ``now`` (Unix seconds).

        Free means: no record, an expired record, or an INPROGRESS record whose lease
        ended.  Returns ``None`` when the claim was written, otherwise the record that
        blocked it — read in the same round trip, never by a second request.
        """
        ...

    async def get(self, key: str) -> Record | None:
        """Read the record of ``key`` with strong consistency (expired records included)."""
        ...

    async def complete(self, completion: Completion) -> bool:
        """Store the response if ``completion.owner`` still owns the key.

        Returns ``False`` (writing nothing) when another claim replaced the record.
        """
        ...

    async def release(self, key: str, owner: str | None) -> bool:
        """Delete the record if ``owner`` still owns it (any record when ``owner`` is None).

        Returns ``False`` when the record belongs to another claim (nothing deleted).
        """
        ...

    async def aclose(self) -> None:
        """Release what the store owns (clients it opened itself)."""
        ...
