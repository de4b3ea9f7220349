"""The optional in-process cache of completed responses."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from idempotency_async.record import Record

__all__ = ["CachedResponse", "ResponseCache"]


@dataclass(frozen=True, slots=True)
class CachedResponse:
    record: Record
    """The COMPLETED record, without its response (that is kept encoded)."""
    encoded: bytes
    expires_at: float
    """When the entry dies, in ``loop.time()`` units: the record's remaining life as the
    store judged it, counted from when the request that brought it was sent."""


class ResponseCache:
    """A bounded LRU of COMPLETED records; in-progress records are never cached.

    Entries die at their ``expires_at`` on the event loop's monotonic clock — never by
    comparing a record's ``expiration`` with this process's wall clock, which may differ
    from the clock the store judges by.  Responses are kept encoded so every hit decodes an
    independent copy.
    """

    def __init__(self, max_items: int) -> None:
        self._max_items = max_items
        self._entries: OrderedDict[str, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> CachedResponse | None:
        """The live entry of ``key`` at ``now`` (``loop.time()`` units), if any."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: CachedResponse) -> None:
        if self._max_items == 0:
            return
        # An exact-size copy: orjson's bytes keep their whole output buffer (4 KB and up).
        entry = CachedResponse(entry.record, bytes(memoryview(entry.encoded)), entry.expires_at)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_items:
            self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
