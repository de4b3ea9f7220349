"""DynamoDBStore records steps (recovery points), against a real moto server on both
transports: each rule of ``RecordsSteps`` at the store level, the requests each one sends,
and the same rules through a Manager."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from _moto import fresh_store
from support import Clock
from test_dynamodb_store import sent_requests

from idempotency_async import Manager, Options, Renewal, errors, step
from idempotency_async.cli._dynamodb import parse as parse_url
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import CLAIMED, Found, RecordsSteps, Stepped, StepWrite
from idempotency_async.stores.dynamodb import DynamoDBStore

pytestmark = pytest.mark.dynamodb

NOW = 1_700_000_000.0
TTL = 3600.0
LEASE = 30.0
ONE = '[["a",1]]'
TWO = '[["a",1],["b",{"x":"y"}]]'


@pytest.fixture
async def store(dynamodb_client: Any, store_client: Any) -> DynamoDBStore:
    """A store on each transport (``store_client``); ``dynamodb_client`` reads items raw."""
    return await fresh_store(dynamodb_client, store_client=store_client)


def claim(
    key: str,
    owner: str,
    *,
    now: float = NOW,
    lease: float = LEASE,
    ttl: float = TTL,
    validation: str | None = None,
) -> Claim:
    return Claim(key, owner, now, lease, ttl, validation)


def write(
    key: str, owner: str, position: int, steps: str, *, now: float = NOW, ttl: float = TTL
) -> StepWrite:
    return StepWrite(key, owner, now, ttl, position, steps)


async def item_of(store: DynamoDBStore, client: Any, key: str) -> dict[str, Any] | None:
    answer = await client.get_item(
        TableName=store.table_name, Key={"id": {"S": key}}, ConsistentRead=True
    )
    item: dict[str, Any] | None = answer.get("Item")
    return item


async def claimed_with(store: DynamoDBStore, key: str, owner: str, *steps: str, **kw: Any) -> None:
    """``owner`` claims ``key`` at NOW and records ``steps`` (each the whole list)."""
    assert await store.claim(claim(key, owner, **kw)) is CLAIMED
    for position, listed in enumerate(steps):
        assert await store.record_step(write(key, owner, position, listed)) is Stepped.RECORDED


def new_key() -> str:
    return f"k#{uuid.uuid4().hex}"


# -- record_step ----------------------------------------------------------------------


async def test_store_has_the_capability(store: DynamoDBStore) -> None:
    assert isinstance(store, RecordsSteps)


async def test_a_step_write_is_one_update_that_sets_the_list_and_count(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    assert await store.claim(claim(key, "A", lease=10.0, ttl=60.0)) is CLAIMED
    before = await item_of(store, dynamodb_client, key)
    assert before is not None
    with sent_requests(store_client) as sent:
        stepped = await store.record_step(write(key, "A", 0, ONE, now=NOW + 5, ttl=60.0))
    assert stepped is Stepped.RECORDED
    assert sent == ["UpdateItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    assert item["steps"] == {"S": ONE}
    assert item["step_count"] == {"N": "1"}
    # The expiry moves like a claim's (ceil(now + ttl)); the lease end does not move.
    assert item["expiration"] == {"N": str(int(NOW + 5 + 60))}
    assert item["in_progress_expiration"] == before["in_progress_expiration"]
    assert await store.record_step(write(key, "A", 1, TWO, now=NOW + 6)) is Stepped.RECORDED
    record = (await store.get(key, now=NOW + 6)).record
    assert record is not None and record.steps == TWO and record.owner == "A"


async def test_a_step_write_is_fenced_by_owner_status_and_position(store: DynamoDBStore) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    assert await store.record_step(write(key, "B", 1, TWO)) is Stepped.LOST  # not the owner
    assert await store.record_step(write(key, "A", 0, TWO)) is Stepped.LOST  # holds 1 step
    assert await store.record_step(write(key, "A", 2, TWO)) is Stepped.LOST
    assert await store.record_step(write(new_key(), "A", 0, ONE)) is Stepped.LOST  # no record
    record = (await store.get(key, now=NOW)).record
    assert record is not None and record.steps == ONE
    done = Completion(key, "A", NOW + 1, TTL, None, b"1", 1)
    await store.complete(done)
    assert await store.record_step(write(key, "A", 1, TWO)) is Stepped.LOST  # completed


async def test_a_resent_step_write_is_recorded_once(
    store: DynamoDBStore, store_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO)
    # The second write sent again after its answer was lost: the record holds it already.
    with sent_requests(store_client) as sent:
        assert await store.record_step(write(key, "A", 1, TWO, now=NOW + 1)) is Stepped.RECORDED
    assert sent == ["UpdateItem"]
    record = (await store.get(key, now=NOW)).record
    assert record is not None and record.steps == TWO
    # ...and the first, resent late, neither applies nor counts as recorded.
    assert await store.record_step(write(key, "A", 0, ONE)) is Stepped.LOST


async def test_a_step_write_never_moves_the_expiry_back_nor_before_the_lease_end(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    # A lease longer than the record's ttl: the claim's expiry is the lease end.
    assert await store.claim(claim(key, "A", lease=500.0, ttl=100.0)) is CLAIMED
    claimed = await item_of(store, dynamodb_client, key)
    assert claimed is not None and claimed["expiration"] == {"N": str(int(NOW + 500))}
    with sent_requests(store_client) as sent:
        stepped = await store.record_step(write(key, "A", 0, ONE, now=NOW + 1, ttl=100.0))
    assert stepped is Stepped.RECORDED
    # Refused by the expiry guard, then written without moving the expiry.
    assert sent == ["UpdateItem", "UpdateItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    assert item["expiration"] == claimed["expiration"]
    assert item["in_progress_expiration"] == claimed["in_progress_expiration"]
    assert item["steps"] == {"S": ONE}
    # Later, past what the lease needs: the expiry moves forward again.
    stepped = await store.record_step(write(key, "A", 1, TWO, now=NOW + 450, ttl=100.0))
    assert stepped is Stepped.RECORDED
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["expiration"] == {"N": str(int(NOW + 550))}


def _big_list(size: int, *, compressible: bool) -> str:
    if compressible:
        result: Any = {"rows": [{"id": n, "status": "ACCEPTED"} for n in range(size // 28)]}
    else:
        result = os.urandom(size // 2).hex()
    return json.dumps([["big", result]], separators=(",", ":"))


async def test_a_list_over_64_kb_is_stored_compressed_and_reads_back(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    key = new_key()
    small = _big_list(50_000, compressible=True)
    big = _big_list(600_000, compressible=True)  # above the item limit as text
    assert len(small.encode()) < 64 * 1024 < 400_000 < len(big.encode())
    await claimed_with(store, key, "A", small)
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["steps"] == {"S": small}
    assert await store.record_step(write(key, "A", 1, big)) is Stepped.RECORDED
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and set(item["steps"]) == {"B"}
    assert zlib.decompress(item["steps"]["B"]).decode() == big
    # A resend of the compressed list is recognised as recorded.
    assert await store.record_step(write(key, "A", 1, big)) is Stepped.RECORDED
    record = (await store.get(key, now=NOW)).record
    assert record is not None and record.steps == big
    # The claim that resumes it gets it back whole.
    verdict = await store.claim(claim(key, "B", now=NOW + LEASE + 1))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == big


async def test_a_list_that_does_not_fit_is_too_large_and_nothing_is_written(
    dynamodb_client: Any, store_client: Any
) -> None:
    store = await fresh_store(dynamodb_client, store_client=store_client)
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    incompressible = _big_list(1_800_000, compressible=False)
    assert len(incompressible.encode()) < store.max_response_bytes
    assert await store.record_step(write(key, "A", 1, incompressible)) is Stepped.TOO_LARGE
    bounded = await fresh_store(dynamodb_client, store_client=store_client, max_response_bytes=100)
    await claimed_with(bounded, key, "A")
    assert await bounded.record_step(write(key, "A", 0, "[" + "1," * 60 + "1]")) is (
        Stepped.TOO_LARGE
    )
    record = (await store.get(key, now=NOW)).record
    assert record is not None and record.steps == ONE


# -- claim ----------------------------------------------------------------------------


async def test_a_claim_resumes_a_lapsed_record_keeping_its_steps(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO, validation="v")
    later = NOW + LEASE + 1
    with sent_requests(store_client) as sent:
        verdict = await store.claim(claim(key, "B", now=later, validation="v"))
    assert sent == ["PutItem", "UpdateItem"]  # the conflict, then the takeover
    assert verdict.found is Found.CLAIMED
    record = verdict.record
    assert record is not None
    assert (record.key, record.owner, record.status, record.steps) == (
        key,
        "B",
        Status.INPROGRESS,
        TWO,
    )
    assert record.lease_end == later + LEASE
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    assert item["owner"] == {"S": "B"} and item["steps"] == {"S": TWO}
    assert item["step_count"] == {"N": "2"} and item["validation"] == {"S": "v"}
    # The new owner records the next step; the old one is fenced out.
    three = TWO[:-1] + ',["c",3]]'
    assert await store.record_step(write(key, "A", 2, three)) is Stepped.LOST
    assert await store.record_step(write(key, "B", 2, three, now=later)) is Stepped.RECORDED


async def test_a_claim_without_steps_to_keep_costs_what_it_did(
    store: DynamoDBStore, store_client: Any
) -> None:
    key = new_key()
    with sent_requests(store_client) as sent:
        assert await store.claim(claim(key, "A")) is CLAIMED
        # A lapsed record without steps: replaced by the PutItem, as before.
        assert await store.claim(claim(key, "B", now=NOW + LEASE + 1)) is CLAIMED
        verdict = await store.claim(claim(key, "C", now=NOW + LEASE + 2))
    assert verdict.found is Found.IN_PROGRESS
    assert sent == ["PutItem", "PutItem", "PutItem"]


async def test_another_payload_gets_resumable_and_nothing_is_written(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, validation="v")
    before = await item_of(store, dynamodb_client, key)
    later = NOW + LEASE + 1
    for validation in ("w", None):
        with sent_requests(store_client) as sent:
            verdict = await store.claim(claim(key, "B", now=later, validation=validation))
        assert sent == ["PutItem"]
        assert verdict.found is Found.RESUMABLE
        assert verdict.record is not None and verdict.record.steps == ONE
        assert verdict.record.validation == "v"
    assert await item_of(store, dynamodb_client, key) == before
    # ...and None is a validation of its own: steps recorded without one are not resumed
    # by a claim carrying one.
    other = new_key()
    await claimed_with(store, other, "A", ONE)
    verdict = await store.claim(claim(other, "B", now=later, validation="v"))
    assert verdict.found is Found.RESUMABLE


async def test_an_expired_record_drops_its_steps(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO, validation="v")
    with sent_requests(store_client) as sent:
        verdict = await store.claim(claim(key, "B", now=NOW + TTL + 2, validation="w"))
    assert verdict is CLAIMED
    assert sent == ["PutItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    assert "steps" not in item and "step_count" not in item and item["owner"] == {"S": "B"}


async def test_a_live_lease_with_steps_is_in_progress(store: DynamoDBStore) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    verdict = await store.claim(claim(key, "B", now=NOW + 1))
    assert verdict.found is Found.IN_PROGRESS
    assert verdict.retry_after == pytest.approx(LEASE - 1, abs=0.01)


async def test_an_own_claim_sent_again_keeps_the_steps(
    store: DynamoDBStore, store_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO, validation="v")
    later = NOW + LEASE + 1
    assert (await store.claim(claim(key, "B", now=later, validation="v"))).found is Found.CLAIMED
    # B's takeover, sent again (its answer lost): B's own record, lease still running.
    with sent_requests(store_client) as sent:
        verdict = await store.claim(claim(key, "B", now=later + 0.5, validation="v"))
    assert sent == ["PutItem", "UpdateItem"]
    assert verdict.found is Found.CLAIMED
    assert verdict.record is not None and verdict.record.steps == TWO
    assert verdict.record.owner == "B"


class _Interleaved:
    """A client that runs ``before_update`` (once) before forwarding the next UpdateItem:
    another worker's write landing between a claim's two requests."""

    def __init__(self, client: Any, before_update: Callable[[], Awaitable[None]]) -> None:
        self._client = client
        self._before: Callable[[], Awaitable[None]] | None = before_update

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **request: Any) -> Any:
        before, self._before = self._before, None
        if before is not None:
            await before()
        return await self._client.update_item(**request)


async def test_a_step_recorded_between_the_two_requests_comes_back_with_the_takeover(
    store: DynamoDBStore, store_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, validation="v")
    later = NOW + LEASE + 1

    async def lapsed_holder_records() -> None:
        # A's lease lapsed, but nobody claimed the key yet: its record is still A's.
        assert await store.record_step(write(key, "A", 1, TWO, now=later)) is Stepped.RECORDED

    racing = DynamoDBStore(
        _Interleaved(store_client, lapsed_holder_records), table_name=store.table_name
    )
    verdict = await racing.claim(claim(key, "B", now=later, validation="v"))
    assert verdict.found is Found.CLAIMED
    assert verdict.record is not None and verdict.record.steps == TWO


async def test_a_takeover_that_loses_the_race_is_judged_again(
    store: DynamoDBStore, store_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, validation="v")
    later = NOW + LEASE + 1

    async def another_claim_wins() -> None:
        verdict = await store.claim(claim(key, "C", now=later, validation="v"))
        assert verdict.found is Found.CLAIMED

    racing = DynamoDBStore(
        _Interleaved(store_client, another_claim_wins), table_name=store.table_name
    )
    verdict = await racing.claim(claim(key, "B", now=later, validation="v"))
    assert verdict.found is Found.IN_PROGRESS
    assert verdict.record is not None and verdict.record.owner == "C"


# -- extend, complete, release ---------------------------------------------------------


async def test_a_renewal_keeps_the_steps(store: DynamoDBStore, dynamodb_client: Any) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    renewed = await store.extend(claim(key, "A", now=NOW + 10))
    assert renewed.value == "renewed"
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["steps"] == {"S": ONE} and item["step_count"] == {"N": "1"}
    assert item["in_progress_expiration"] == {"N": str(int((NOW + 10 + LEASE) * 1000))}


@pytest.mark.parametrize("response", [True, False], ids=["response", "without-response"])
async def test_a_completion_removes_the_steps(
    store: DynamoDBStore, dynamodb_client: Any, response: bool
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO)
    encoded = b'{"ok":1}' if response else None
    done = Completion(key, "A", NOW + 1, TTL, None, encoded, {"ok": 1} if response else None)
    await store.complete(done)
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["status"] == {"S": "COMPLETED"}
    assert "steps" not in item and "step_count" not in item
    record = (await store.get(key, now=NOW + 2)).record
    assert record is not None and record.steps is None


async def test_a_release_keeps_the_steps_as_the_released_state(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, TWO, validation="v")
    before = await item_of(store, dynamodb_client, key)
    assert before is not None
    with sent_requests(store_client) as sent:
        assert await store.release(key, "A") is True
    assert sent == ["DeleteItem", "UpdateItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    assert "owner" not in item
    assert item["in_progress_expiration"] == {"N": "1000"}  # long past, on every clock
    for kept in ("status", "expiration", "validation", "steps", "step_count"):
        assert item[kept] == before[kept]
    record = (await store.get(key, now=NOW + 1)).record
    assert record is not None and record.owner is None and record.steps == TWO
    assert (await store.get(key, now=NOW + 1)).found is Found.CLAIMABLE
    # Released: the release sent again, or by another owner, answers True; nothing changes.
    assert await store.release(key, "A") is True
    assert await store.release(key, "B") is True
    assert await item_of(store, dynamodb_client, key) == item
    # The old owner can write nothing more.
    assert await store.record_step(write(key, "A", 2, TWO[:-1] + ',["c",3]]')) is Stepped.LOST
    assert (await store.extend(claim(key, "A", now=NOW + 2))).value == "lost"
    # A claim resumes it at once, in the same second.
    verdict = await store.claim(claim(key, "B", now=NOW + 1, validation="v"))
    assert verdict.found is Found.CLAIMED
    assert verdict.record is not None and verdict.record.steps == TWO


async def test_a_release_without_steps_deletes_in_one_request(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A")
    with sent_requests(store_client) as sent:
        assert await store.release(key, "A") is True
    assert sent == ["DeleteItem"]
    assert await item_of(store, dynamodb_client, key) is None
    assert await store.release(key, "A") is True  # gone counts as released


async def test_a_stale_release_leaves_the_new_owners_steps(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE, validation="v")
    assert (await store.claim(claim(key, "B", now=NOW + LEASE + 1, validation="v"))).found is (
        Found.CLAIMED
    )
    before = await item_of(store, dynamodb_client, key)
    assert await store.release(key, "A") is False
    assert await item_of(store, dynamodb_client, key) == before


async def test_force_release_removes_the_steps(store: DynamoDBStore) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    removed = await store.force_release(key)
    assert removed is not None and removed.steps == ONE
    assert (await store.get(key, now=NOW)).record is None


async def test_an_operators_exact_release_covers_the_steps_it_showed(
    store: DynamoDBStore,
) -> None:
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    shown = (await store.get(key, now=NOW)).record
    assert shown is not None and shown.steps == ONE
    # A step recorded in the same second: expiry and lease read the same, the steps do not.
    assert await store.record_step(write(key, "A", 1, TWO)) is Stepped.RECORDED
    assert await store.release_exactly(shown) is False
    now_shown = (await store.get(key, now=NOW)).record
    assert now_shown is not None and await store.release_exactly(now_shown) is True
    assert (await store.get(key, now=NOW)).record is None


# -- the layout -----------------------------------------------------------------------


async def test_the_step_attributes_can_be_renamed(dynamodb_client: Any, store_client: Any) -> None:
    store = await fresh_store(
        dynamodb_client, store_client=store_client, steps_attr="sp", step_count_attr="sn"
    )
    key = new_key()
    await claimed_with(store, key, "A", ONE)
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["sp"] == {"S": ONE} and item["sn"] == {"N": "1"}
    assert "steps" not in item
    verdict = await store.claim(claim(key, "B", now=NOW + LEASE + 1))
    assert verdict.record is not None and verdict.record.steps == ONE
    await store.release(key, "B")
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and "owner" not in item and item["sp"] == {"S": ONE}


def test_the_cli_url_renames_the_step_attributes() -> None:
    target = parse_url(
        urlsplit("dynamodb://orders?region=eu-west-1&steps_attr=sp&step_count_attr=sn")
    )
    assert target.options == {"steps_attr": "sp", "step_count_attr": "sn"}


@pytest.mark.parametrize(
    "names",
    [
        {"steps_attr": "data"},
        {"step_count_attr": "steps"},
        {"steps_attr": "owner"},
        {"step_count_attr": "id"},
        {"steps_attr": ""},
    ],
)
def test_step_attribute_names_are_checked_like_the_others(names: dict[str, str]) -> None:
    with pytest.raises(errors.ConfigError):
        DynamoDBStore(object(), table_name="t", **names)


@pytest.mark.parametrize(
    "fields",
    [
        {"steps": {"N": "1"}, "step_count": {"N": "1"}},
        {"steps": {"S": ONE}},
        {"step_count": {"N": "1"}},
        {"steps": {"S": ONE}, "step_count": {"S": "1"}},
        {"steps": {"S": ONE}, "step_count": {"N": "0"}},
        {"steps": {"S": ONE}, "step_count": {"N": "1.5"}},
        {"steps": {"S": ONE}, "step_count": {"N": "99999999999"}},
        {"steps": {"S": '{"a":1}'}, "step_count": {"N": "1"}},
        {"steps": {"B": b"not zlib"}, "step_count": {"N": "1"}},
        {"steps": {"B": zlib.compress(b"[" + b"0," * 10_000 + b"0]")}, "step_count": {"N": "1"}},
        {"steps": {"B": zlib.compress(b"[\xff]")}, "step_count": {"N": "1"}},
        {"steps": {"S": "[" + "1," * 10_000 + "1]"}, "step_count": {"N": "1"}},
        {"steps": {"L": [{"S": "a"}]}, "step_count": {"N": "1"}},
    ],
    ids=[
        "number",
        "no-count",
        "no-list",
        "count-as-text",
        "zero-count",
        "fractional-count",
        "huge-count",
        "not-an-array",
        "not-zlib",
        "inflates-beyond-the-bound",
        "not-utf8",
        "text-beyond-the-bound",
        "a-list",
    ],
)
async def test_malformed_steps_make_an_inprogress_record_unreadable(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any, fields: dict[str, Any]
) -> None:
    # Bounded at 10,000 bytes of step list (max_response_bytes), as it reads responses.
    store = DynamoDBStore(store_client, table_name=store.table_name, max_response_bytes=10_000)
    key = new_key()
    assert await store.claim(claim(key, "A")) is CLAIMED
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    await dynamodb_client.put_item(TableName=store.table_name, Item={**item, **fields})
    with pytest.raises(errors.InconsistentStateError, match=key):
        await store.get(key, now=NOW)
    if "steps" in fields:
        # The claim does not replace it (it might be progress), and cannot resume it.
        with pytest.raises(errors.InconsistentStateError, match=key):
            await store.claim(claim(key, "B", now=NOW + LEASE + 1))


async def test_steps_left_on_a_completed_record_are_ignored(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    # Only a foreign writer leaves them there: the record still replays.
    key = new_key()
    await claimed_with(store, key, "A")
    await store.complete(Completion(key, "A", NOW, TTL, None, b'"done"', "done"))
    item = await item_of(store, dynamodb_client, key)
    assert item is not None
    item["steps"] = {"N": "7"}
    await dynamodb_client.put_item(TableName=store.table_name, Item=item)
    verdict = await store.claim(claim(key, "B", now=NOW + 1))
    assert verdict.found is Found.COMPLETED
    assert verdict.record is not None and verdict.record.response == "done"
    assert verdict.record.steps is None


# -- through a Manager ----------------------------------------------------------------


class _Work:
    """Three steps; counts each one's runs; raises after step ``fail_after`` when set."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {"create": 0, "charge": 0, "receipt": 0}
        self.fail_after: int | None = None

    def effect(self, name: str, result: Any) -> Callable[[], Awaitable[Any]]:
        async def run() -> Any:
            self.runs[name] += 1
            return result

        return run

    async def __call__(self) -> dict[str, Any]:
        order = await step("create", self.effect("create", {"order": "o1"}))
        if self.fail_after == 1:
            raise RuntimeError("after create")
        charge = await step("charge", self.effect("charge", {"charge": "ch1", "n": 1.5}))
        if self.fail_after == 2:
            raise RuntimeError("after charge")
        await step("receipt", self.effect("receipt", None))
        return {**order, **charge}


def manager_for(store: DynamoDBStore, clock: Clock | None = None, **options: Any) -> Manager:
    return Manager(store, Options(key_prefix="steps", clock=clock or Clock(), **options))


@pytest.mark.parametrize("fail_after", [1, 2])
async def test_a_call_that_raised_after_step_k_resumes_there(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any, fail_after: int
) -> None:
    manager = manager_for(store)
    work = _Work()
    work.fail_after = fail_after
    payload = {"id": uuid.uuid4().hex}
    key = manager.key_for(payload)
    assert key is not None
    with sent_requests(store_client) as sent, pytest.raises(RuntimeError):
        await manager.execute(payload, work, timeout=30)
    # Claim, one write per step, then the release that keeps them.
    assert sent == ["PutItem", *["UpdateItem"] * fail_after, "DeleteItem", "UpdateItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and "owner" not in item
    assert item["step_count"] == {"N": str(fail_after)}

    work.fail_after = None
    with sent_requests(store_client) as sent:
        result = await manager.execute(payload, work, timeout=30)
    assert result == {"order": "o1", "charge": "ch1", "n": 1.5}
    assert work.runs == {"create": 1, "charge": 1, "receipt": 1}
    # The resuming claim (two requests), the steps not yet recorded, the completion.
    assert sent == ["PutItem", "UpdateItem", *["UpdateItem"] * (3 - fail_after), "UpdateItem"]
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and item["status"] == {"S": "COMPLETED"}
    assert "steps" not in item and "step_count" not in item
    # A duplicate replays; no step runs again.
    assert await manager.execute(payload, work, timeout=30) == result
    assert work.runs == {"create": 1, "charge": 1, "receipt": 1}


async def test_a_crashed_call_is_resumed_once_its_lease_lapsed(store: DynamoDBStore) -> None:
    clock = Clock()
    manager = manager_for(store, clock)
    work = _Work()
    payload = {"id": uuid.uuid4().hex}
    key = manager.key_for(payload)
    assert key is not None
    # A worker that crashed after recording step 1 (its claim and write, as the manager
    # sends them).
    assert await store.claim(Claim(key, "dead", clock.now, 10.0, TTL)) is CLAIMED
    create = json.dumps([["create", {"order": "o1"}]], separators=(",", ":"))
    assert await store.record_step(StepWrite(key, "dead", clock.now, TTL, 0, create)) is (
        Stepped.RECORDED
    )
    with pytest.raises(errors.AlreadyInProgressError):
        await manager.execute(payload, work, timeout=30)
    clock.advance(11)
    assert await manager.execute(payload, work, timeout=30) == {
        "order": "o1",
        "charge": "ch1",
        "n": 1.5,
    }
    assert work.runs == {"create": 0, "charge": 1, "receipt": 1}


async def test_an_expired_record_runs_every_step_again(store: DynamoDBStore) -> None:
    clock = Clock()
    manager = manager_for(store, clock, expires_after=60)
    work = _Work()
    work.fail_after = 2
    payload = {"id": uuid.uuid4().hex}
    with pytest.raises(RuntimeError):
        await manager.execute(payload, work, timeout=30)
    clock.advance(61)
    work.fail_after = None
    await manager.execute(payload, work, timeout=30)
    assert work.runs == {"create": 2, "charge": 2, "receipt": 1}


async def test_another_payload_cannot_resume_the_progress(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    manager = manager_for(store, event_key_jmespath="id", payload_validation_jmespath="amount")
    work = _Work()
    work.fail_after = 1
    payload = {"id": uuid.uuid4().hex, "amount": 10}
    key = manager.key_for(payload)
    assert key is not None
    with pytest.raises(RuntimeError):
        await manager.execute(payload, work, timeout=30)
    before = await item_of(store, dynamodb_client, key)
    work.fail_after = None
    with pytest.raises(errors.PayloadValidationError):
        await manager.execute({**payload, "amount": 11}, work, timeout=30)
    assert work.runs == {"create": 1, "charge": 0, "receipt": 0}
    assert await item_of(store, dynamodb_client, key) == before
    # Its own payload resumes it.
    await manager.execute(payload, work, timeout=30)
    assert work.runs == {"create": 1, "charge": 1, "receipt": 1}


async def test_a_renewed_lease_keeps_the_steps(store: DynamoDBStore, dynamodb_client: Any) -> None:
    # The real clock: renewal runs on the event loop's timers.
    manager = Manager(store, Options(key_prefix="renew", renewal=Renewal(lease=3.0, every=0.5)))
    payload = {"id": uuid.uuid4().hex}
    key = manager.key_for(payload)
    assert key is not None
    seen: list[dict[str, Any]] = []

    async def work() -> str:
        await step("one", lambda: _value(1))
        first = await item_of(store, dynamodb_client, key)
        assert first is not None
        seen.append(first)
        # Wait (on the store's requests, not a sleep) until a renewal moved the lease.
        for _ in range(200):
            item = await item_of(store, dynamodb_client, key)
            assert item is not None
            if item["in_progress_expiration"] != first["in_progress_expiration"]:
                seen.append(item)
                break
            await asyncio.sleep(0.05)
        await step("two", lambda: _value(2))
        return "done"

    assert await manager.execute(payload, work, timeout=30) == "done"
    assert len(seen) == 2, "no renewal was seen"
    assert seen[1]["steps"] == seen[0]["steps"] == {"S": '[["one",1]]'}
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and "steps" not in item


async def _value(value: Any) -> Any:
    return value


class _LosesTakeoverAnswer:
    """A client whose takeover (the UpdateItem answering ALL_NEW) applies, and whose
    answer is then lost (a dropped connection)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **request: Any) -> Any:
        answer = await self._client.update_item(**request)
        if request.get("ReturnValues") == "ALL_NEW" and not self.lost:
            self.lost += 1
            raise ConnectionResetError("the takeover's answer was lost")
        return answer


async def test_a_takeover_whose_answer_was_lost_is_released_keeping_the_steps(
    store: DynamoDBStore, store_client: Any, dynamodb_client: Any
) -> None:
    work = _Work()
    work.fail_after = 1
    payload = {"id": uuid.uuid4().hex}
    losing = _LosesTakeoverAnswer(store_client)
    manager = manager_for(DynamoDBStore(losing, table_name=store.table_name))
    key = manager.key_for(payload)
    assert key is not None
    with pytest.raises(RuntimeError):
        await manager.execute(payload, work, timeout=30)
    work.fail_after = None
    # The resume's takeover applied, its answer was lost: the manager's owner-fenced
    # release after an unknown claim keeps the steps it never saw.
    with pytest.raises(errors.StoreUnavailableError):
        await manager.execute(payload, work, timeout=30)
    assert losing.lost == 1
    item = await item_of(store, dynamodb_client, key)
    assert item is not None and "owner" not in item and item["step_count"] == {"N": "1"}
    assert await manager.execute(payload, work, timeout=30) == {
        "order": "o1",
        "charge": "ch1",
        "n": 1.5,
    }
    assert work.runs == {"create": 1, "charge": 1, "receipt": 1}
