"""The store contract: every store (memory, DynamoDB, …) must pass this suite unchanged."""

from __future__ import annotations

import asyncio

from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import Store

NOW = 1_700_000_000.0


def claim(
    key: str = "k#1", owner: str = "owner-a", *, lease_s: float = 30, now: float = NOW
) -> Claim:
    return Claim(
        key=key,
        owner=owner,
        expiration=int(now + 3600),
        lease_end=int((now + lease_s) * 1000),
        validation="v-hash",
    )


def completion(key: str = "k#1", owner: str = "owner-a", response: object = None) -> Completion:
    return Completion(
        key=key, owner=owner, expiration=int(NOW + 3600), validation="v-hash", response=response
    )


async def test_claim_of_free_key_writes_an_in_progress_record(store: Store) -> None:
    assert await store.claim(claim(), now=NOW) is None
    record = await store.get("k#1")
    assert record is not None
    assert record.status is Status.INPROGRESS
    assert record.owner == "owner-a"
    assert record.validation == "v-hash"
    assert record.lease_end == int((NOW + 30) * 1000)


async def test_conflicting_claim_returns_the_existing_record(store: Store) -> None:
    await store.claim(claim(owner="owner-a"), now=NOW)
    existing = await store.claim(claim(owner="owner-b"), now=NOW + 1)
    assert existing is not None
    assert existing.owner == "owner-a"
    assert existing.status is Status.INPROGRESS
    assert (await store.get("k#1")).owner == "owner-a"  # type: ignore[union-attr]


async def test_claim_succeeds_once_the_lease_has_lapsed(store: Store) -> None:
    await store.claim(claim(owner="owner-a", lease_s=5), now=NOW)
    assert await store.claim(claim(owner="owner-b"), now=NOW + 4) is not None
    assert await store.claim(claim(owner="owner-b", now=NOW + 6), now=NOW + 6) is None
    assert (await store.get("k#1")).owner == "owner-b"  # type: ignore[union-attr]


async def test_completed_record_blocks_claims_until_it_expires(store: Store) -> None:
    await store.claim(claim(), now=NOW)
    assert await store.complete(completion(response={"ok": 1}))
    existing = await store.claim(claim(owner="owner-b"), now=NOW + 100)
    assert existing is not None and existing.status is Status.COMPLETED
    assert existing.response == {"ok": 1}
    later = NOW + 3601
    assert await store.claim(claim(owner="owner-b", now=later), now=later) is None


async def test_complete_by_a_stale_owner_is_refused_and_changes_nothing(store: Store) -> None:
    await store.claim(claim(owner="owner-a", lease_s=1), now=NOW)
    await store.claim(claim(owner="owner-b", now=NOW + 2), now=NOW + 2)
    assert await store.complete(completion(owner="owner-a", response="zombie")) is False
    record = await store.get("k#1")
    assert record is not None
    assert record.owner == "owner-b" and record.status is Status.INPROGRESS


async def test_release_by_a_stale_owner_is_refused(store: Store) -> None:
    await store.claim(claim(owner="owner-a", lease_s=1), now=NOW)
    await store.claim(claim(owner="owner-b", now=NOW + 2), now=NOW + 2)
    assert await store.release("k#1", "owner-a") is False
    assert (await store.get("k#1")).owner == "owner-b"  # type: ignore[union-attr]


async def test_release_by_the_owner_deletes_the_record(store: Store) -> None:
    await store.claim(claim(), now=NOW)
    assert await store.release("k#1", "owner-a") is True
    assert await store.get("k#1") is None
    assert await store.claim(claim(owner="owner-b"), now=NOW) is None


async def test_unconditional_release_deletes_any_record(store: Store) -> None:
    await store.claim(claim(), now=NOW)
    await store.complete(completion(response=1))
    assert await store.release("k#1", None) is True
    assert await store.get("k#1") is None


async def test_complete_of_a_missing_record_is_refused(store: Store) -> None:
    assert await store.complete(completion(response=1)) is False
    assert await store.get("k#1") is None


async def test_responses_round_trip_with_identical_types(store: Store) -> None:
    values: list[object] = [
        0,
        "",
        [],
        {},
        False,
        None,
        0.1,
        -1.5e-10,
        2**63,
        2**70,
        -(2**64),
        1e300,
        "café 😀\u2028",
        {"nested": [1, 2.5, {"deep": [None, True, "x"]}], "empty": {"a": []}},
    ]
    for index, value in enumerate(values):
        key = f"k#{index}"
        await store.claim(claim(key), now=NOW)
        assert await store.complete(completion(key, response=value))
        record = await store.get(key)
        assert record is not None and record.status is Status.COMPLETED
        assert record.response == value
        assert _types(record.response) == _types(value), value


async def test_response_not_stored_marker_round_trips(store: Store) -> None:
    await store.claim(claim(), now=NOW)
    done = Completion(
        key="k#1",
        owner="owner-a",
        expiration=int(NOW + 3600),
        validation="v-hash",
        response=None,
        response_stored=False,
    )
    assert await store.complete(done)
    record = await store.get("k#1")
    assert record is not None
    assert record.status is Status.COMPLETED and record.response_stored is False


async def test_each_read_returns_an_independent_copy(store: Store) -> None:
    await store.claim(claim(), now=NOW)
    await store.complete(completion(response={"items": [1, 2]}))
    first = await store.get("k#1")
    assert first is not None
    first.response["items"].append(3)
    second = await store.get("k#1")
    assert second is not None and second.response == {"items": [1, 2]}


async def test_concurrent_claims_of_one_key_have_exactly_one_winner(store: Store) -> None:
    results = await asyncio.gather(
        *(store.claim(claim(owner=f"owner-{n}"), now=NOW) for n in range(20))
    )
    winners = [r for r in results if r is None]
    assert len(winners) == 1
    record = await store.get("k#1")
    assert record is not None
    losers = {r.owner for r in results if r is not None}
    assert losers == {record.owner}


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)
