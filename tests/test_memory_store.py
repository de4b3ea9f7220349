"""MemoryStore specifics (its contract is in test_store_contract.py)."""

from __future__ import annotations

from idempotency_async import MemoryStore
from idempotency_async.record import Claim, Completion

NOW = 1_700_000_000.0


def _claim(key: str, now: float, ttl: int = 10) -> Claim:
    return Claim(key, "owner", int(now) + ttl, int((now + 5) * 1000), None)


async def test_expired_records_are_dropped_as_new_ones_arrive() -> None:
    store = MemoryStore()
    for n in range(1000):
        assert await store.claim(_claim(f"old-{n}", NOW), now=NOW) is None
    later = NOW + 60
    for n in range(600):
        assert await store.claim(_claim(f"new-{n}", later), now=later) is None
    assert len(store) == 600
    assert await store.get("old-0") is None


async def test_a_completed_record_moves_behind_records_that_expire_sooner() -> None:
    store = MemoryStore()
    await store.claim(_claim("long", NOW), now=NOW)
    await store.claim(_claim("short", NOW), now=NOW)
    # Completing "long" extends its expiry: it must not stay in front of "short".
    await store.complete(Completion("long", "owner", int(NOW) + 3600, None, "kept"))
    later = NOW + 60  # "short" has expired, "long" has not
    await store.claim(_claim("fresh", later), now=later)
    assert await store.get("short") is None
    record = await store.get("long")
    assert record is not None and record.response == "kept"


async def test_purge_drops_every_expired_record() -> None:
    store = MemoryStore()
    await store.claim(_claim("a", NOW, ttl=3600), now=NOW)
    await store.claim(_claim("b", NOW), now=NOW)
    assert store.purge(NOW + 60) == 1
    assert len(store) == 1
