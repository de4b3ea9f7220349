"""MemoryStore specifics (its contract is in test_store_contract.py)."""

from __future__ import annotations

import tracemalloc

import pytest

from idempotency_async import MemoryStore
from idempotency_async._json import encode_json
from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Found, Written

NOW = 1_700_000_000.0


def _claim(key: str, now: float, ttl: float = 10, owner: str = "owner") -> Claim:
    return Claim(key, owner, now, 5.0, ttl, None)


async def test_expired_records_are_dropped_as_new_ones_arrive() -> None:
    store = MemoryStore()
    for n in range(1000):
        assert (await store.claim(_claim(f"old-{n}", NOW))).found is Found.CLAIMED
    later = NOW + 60
    for n in range(600):
        assert (await store.claim(_claim(f"new-{n}", later))).found is Found.CLAIMED
    assert len(store) == 600
    assert (await store.get("old-0", now=later)).record is None


async def test_mixed_ttls_drop_whatever_expired_first() -> None:
    store = MemoryStore(max_records=3)
    await store.claim(_claim("long", NOW, ttl=3600))
    await store.claim(_claim("short-1", NOW, ttl=10))
    await store.claim(_claim("short-2", NOW, ttl=10))
    later = NOW + 60  # both short records expired behind a long-lived one
    assert (await store.claim(_claim("fresh-1", later))).found is Found.CLAIMED
    assert (await store.claim(_claim("fresh-2", later))).found is Found.CLAIMED
    assert len(store) == 3
    assert (await store.get("long", now=later)).record is not None


async def test_a_full_store_refuses_new_claims_and_keeps_live_records() -> None:
    store = MemoryStore(max_records=2)
    await store.claim(_claim("a", NOW))
    await store.claim(_claim("b", NOW))
    assert (
        await store.complete(Completion("b", "owner", NOW, 10, None, encode_json(1), 1))
        is Written.RESPONSE
    )
    with pytest.raises(StoreUnavailableError, match="max_records"):
        await store.claim(_claim("c", NOW + 1))
    assert (await store.get("a", now=NOW + 1)).found is Found.IN_PROGRESS
    assert (await store.get("b", now=NOW + 1)).found is Found.COMPLETED
    # a key already held is judged, not refused
    assert (await store.claim(_claim("a", NOW + 1, owner="other"))).found is Found.IN_PROGRESS
    # once a record expires, room is made
    assert (await store.claim(_claim("c", NOW + 30))).found is Found.CLAIMED


async def test_a_completed_record_moves_behind_records_that_expire_sooner() -> None:
    store = MemoryStore()
    await store.claim(_claim("long", NOW))
    await store.claim(_claim("short", NOW))
    # Completing "long" extends its expiry: it must not be dropped with "short".
    await store.complete(Completion("long", "owner", NOW, 3600, None, encode_json("kept"), "kept"))
    later = NOW + 60
    await store.claim(_claim("fresh", later))
    assert (await store.get("short", now=later)).record is None
    record = (await store.get("long", now=later)).record
    assert record is not None and record.response == "kept"


async def test_purge_drops_every_expired_record() -> None:
    store = MemoryStore()
    await store.claim(_claim("a", NOW, ttl=3600))
    await store.claim(_claim("b", NOW))
    assert store.purge(NOW + 60) == 1
    assert len(store) == 1


async def test_per_record_memory_stays_near_the_response_size() -> None:
    store = MemoryStore()
    response = {"order": "o-1", "items": [{"sku": f"s{n}", "qty": n} for n in range(8)]}
    size = len(encode_json(response))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(2000):
        key = f"key-{n:06d}"
        await store.claim(_claim(key, NOW, ttl=3600))
        result = dict(response)
        await store.complete(Completion(key, "owner", NOW, 3600, None, encode_json(result), result))
    per_record = (tracemalloc.get_traced_memory()[0] - before) / 2000
    tracemalloc.stop()
    # the encoded response, the key, the entry and its heap/dict slots; not a kept result
    assert per_record < size + 600, (per_record, size)


def test_max_records_is_validated() -> None:
    with pytest.raises(ConfigError):
        MemoryStore(max_records=0)
