"""RedisStore records steps (recovery points) on real redis-server processes: the record
text, each script's rule (claim, extend, complete, release, step), hostile step lists, and
the Manager resuming a call through the store.

The shared store contract's steps section covers the obligations every store has; this
file covers how the Redis scripts keep them (the text they write, ``PX``, ``TIME``,
wake-ups, resends through a proxy that loses answers, the cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import RedisServer, fresh_redis_store
from _tcp_proxy import lossy_proxy

from idempotency_async import Manager, Options, errors, step
from idempotency_async._json import encode_json
from idempotency_async.options import Renewal, Wait
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores._redis_records import claim_tail
from idempotency_async.stores.base import CLAIMED, Extended, Found, Stepped, StepWrite, Written
from idempotency_async.stores.redis import _CLAIM, RedisStore

pytestmark = pytest.mark.redis

LEASE, TTL = 30.0, 3600.0
ONE = '[["a",{"data":1}]]'
TWO = '[["a",{"data":1}],["b",",\\"data\\":2"]]'


def claim(key: str = "k", owner: str = "a", now: float | None = None, **kw: Any) -> Claim:
    return Claim(
        key,
        owner,
        time.time() if now is None else now,
        kw.get("lease", LEASE),
        kw.get("ttl", TTL),
        kw.get("validation", "h"),
    )


def write(
    steps: str, position: int, key: str = "k", owner: str = "a", now: float | None = None
) -> StepWrite:
    return StepWrite(key, owner, time.time() if now is None else now, TTL, position, steps)


def completion(key: str = "k", owner: str = "a", response: Any = 1) -> Completion:
    return Completion(key, owner, time.time(), TTL, "h", encode_json(response), response)


@pytest.fixture(params=["standalone", "cluster"])
async def store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[RedisStore]:
    cluster = request.param == "cluster"
    server = request.getfixturevalue("redis_cluster") if cluster else redis_server
    async with fresh_redis_store(server, cluster=cluster) as redis_store:
        redis_store.test_server = server  # type: ignore[attr-defined]
        redis_store.test_cluster = cluster  # type: ignore[attr-defined]
        # One client to inspect the server with (a cluster client takes a while to start).
        inspect = server.cluster_client() if cluster else server.client()
        redis_store.test_client = inspect  # type: ignore[attr-defined]
        try:
            yield redis_store
        finally:
            await inspect.aclose()


@contextlib.asynccontextmanager
async def _client(store: RedisStore) -> AsyncIterator[Any]:
    """The store fixture's inspection client, or a client of its own for stores built in
    a test (closed after)."""
    kept = getattr(store, "test_client", None)
    if kept is not None:
        yield kept
        return
    client = store.test_server.client()  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        await client.aclose()


async def raw(store: RedisStore, key: str = "k") -> bytes | None:
    async with _client(store) as client:
        value: bytes | None = await client.get(store.key_prefix + key)
        return value


async def parsed(store: RedisStore, key: str = "k") -> dict[str, Any]:
    text = await raw(store, key)
    assert text is not None
    item: dict[str, Any] = json.loads(text)
    return item


async def pttl(store: RedisStore, key: str = "k") -> int:
    async with _client(store) as client:
        return int(await client.pttl(store.key_prefix + key))


async def expire_time(store: RedisStore, key: str = "k") -> int:
    """The key's absolute expiry (``PEXPIRETIME``, Redis 7), in Unix milliseconds."""
    async with _client(store) as client:
        return int(await client.execute_command("PEXPIRETIME", store.key_prefix + key))


async def put(store: RedisStore, item: dict[str, Any] | bytes, key: str = "k") -> None:
    async with _client(store) as client:
        text = item if isinstance(item, bytes) else json.dumps(item).encode()
        await client.set(store.key_prefix + key, text, px=3_600_000)


async def stepped(store: RedisStore, key: str = "k", steps: str = ONE) -> None:
    """The key claimed by owner ``a`` with ``steps`` recorded (one step per entry)."""
    assert await store.claim(claim(key)) is CLAIMED
    entries = json.loads(steps)
    for n in range(1, len(entries) + 1):
        text = encode_json(entries[:n]).decode()
        assert await store.record_step(write(text, n - 1, key)) is Stepped.RECORDED


# -- the record text ---------------------------------------------------------------------


async def test_steps_travel_as_one_json_string_after_the_owner(store: RedisStore) -> None:
    await stepped(store, steps=TWO)
    text = await raw(store)
    assert text is not None
    # No result can put the top-level ",\"data\":" cut into an in-progress record.
    assert b',"data":' not in text
    assert text.endswith(
        b',"step_count":2,"steps":' + json.dumps(TWO).encode().replace(b"/", b"\\/") + b"}"
    )
    item = json.loads(text)
    assert list(item) == [
        "status",
        "expiration",
        "in_progress_expiration",
        "validation",
        "owner",
        "step_count",
        "steps",
    ]
    assert item["steps"] == TWO
    record = (await store.get("k", now=time.time())).record
    assert record is not None and record.steps == TWO


async def test_a_record_without_steps_is_written_as_before(store: RedisStore) -> None:
    assert await store.claim(claim()) is CLAIMED
    assert "steps" not in await parsed(store)
    assert "step_count" not in await parsed(store)


# -- claim ---------------------------------------------------------------------------------


async def test_claim_keeps_a_lapsed_records_steps_and_answers_them(store: RedisStore) -> None:
    assert await store.claim(claim(lease=0.05)) is CLAIMED
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
    await asyncio.sleep(0.1)
    verdict = await store.claim(claim(owner="b"))
    assert verdict.found is Found.CLAIMED and verdict is not CLAIMED
    assert verdict.record is not None
    assert verdict.record.steps == ONE and verdict.record.owner == "b"
    item = await parsed(store)
    assert (item["owner"], item["step_count"], item["steps"]) == ("b", 1, ONE)
    # The new claim's lease, not the lapsed one.
    assert item["in_progress_expiration"] > time.time() * 1000 + 20_000


async def test_claim_keeps_its_own_records_steps_when_sent_again(store: RedisStore) -> None:
    await stepped(store)
    verdict = await store.claim(claim())  # the same owner: a claim resent
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == ONE


async def test_claim_keeps_steps_when_both_validations_are_absent(store: RedisStore) -> None:
    assert await store.claim(claim(validation=None, lease=0.05)) is CLAIMED
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
    await asyncio.sleep(0.1)
    verdict = await store.claim(claim(owner="b", validation=None))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == ONE and verdict.record.validation is None
    # One absent and one present differ: resumable, nothing written.
    assert (await store.release("k", "b")) is True
    verdict = await store.claim(claim(owner="c", validation="h"))
    assert verdict.found is Found.RESUMABLE


async def test_a_resuming_claim_waits_for_its_replicas(redis_server: RedisServer) -> None:
    # min_replicas: a claim that kept steps was written like any other, and is refused
    # like any other when too few replicas acknowledged it (this server has none).
    async with fresh_redis_store(redis_server) as store:
        assert await store.claim(claim(lease=0.05)) is CLAIMED
        assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
        await asyncio.sleep(0.1)
        async with fresh_redis_store(
            redis_server, key_prefix=store.key_prefix, min_replicas=1, replica_timeout=0.05
        ) as waiting:
            with pytest.raises(errors.StoreUnavailableError, match="min_replicas"):
                await waiting.claim(claim(owner="b"))


async def test_another_validation_answers_resumable_and_writes_nothing(store: RedisStore) -> None:
    await stepped(store)
    assert await store.release("k", "a") is True
    before = await raw(store)
    verdict = await store.claim(claim(owner="b", validation="other"))
    assert verdict.found is Found.RESUMABLE
    assert verdict.record is not None and verdict.record.steps == ONE
    assert verdict.record.owner is None and verdict.record.validation == "h"
    assert await raw(store) == before


async def test_a_lapsed_record_under_another_validation_is_resumable(store: RedisStore) -> None:
    assert await store.claim(claim(lease=0.05)) is CLAIMED
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
    await asyncio.sleep(0.1)
    before = await raw(store)
    verdict = await store.claim(claim(owner="b", validation="other"))
    assert verdict.found is Found.RESUMABLE and verdict.record is not None
    assert verdict.record.owner == "a"
    assert await raw(store) == before


async def test_an_unexpired_holder_is_still_in_progress_whatever_its_steps(
    store: RedisStore,
) -> None:
    await stepped(store)
    verdict = await store.claim(claim(owner="b", validation="other"))
    assert verdict.found is Found.IN_PROGRESS


async def test_claim_drops_an_expired_records_steps(store: RedisStore) -> None:
    now = time.time()
    # An expired record (its expiry in the past) still on the server: its steps are gone.
    await put(
        store,
        {
            "status": "INPROGRESS",
            "expiration": int(now) - 5,
            "in_progress_expiration": int((now - 10) * 1000),
            "validation": "other",
            "owner": "dead",
            "step_count": 1,
            "steps": ONE,
        },
    )
    assert await store.claim(claim(owner="b")) is CLAIMED
    item = await parsed(store)
    assert "steps" not in item and "step_count" not in item and item["owner"] == "b"


async def test_the_first_claims_answer_is_unchanged(store: RedisStore) -> None:
    async with _client(store) as client:
        answer = await client.evalsha(
            _CLAIM.sha,
            1,
            store.key_prefix + "fresh",
            "a",
            b"",
            LEASE,
            TTL,
            claim_tail("a", "h"),
            b"",
        )
    assert answer == 1  # no record, no text, nothing to decode


# -- extend --------------------------------------------------------------------------------


async def test_renewals_keep_the_steps_across_many_extends(store: RedisStore) -> None:
    await stepped(store, steps=TWO)
    for n in range(50):
        assert await store.extend(claim(lease=LEASE + n)) is Extended.RENEWED
    item = await parsed(store)
    assert (item["step_count"], item["steps"], item["owner"]) == (2, TWO, "a")
    # A step after the renewals still finds its position.
    three = TWO[:-1] + ',["c",3]]'
    assert await store.record_step(write(three, 2)) is Stepped.RECORDED
    assert (await parsed(store))["steps"] == three


async def test_a_renewal_meeting_a_damaged_step_list_erases_nothing(store: RedisStore) -> None:
    await stepped(store)
    item = await parsed(store)
    item["step_count"] = "one"
    await put(store, item)
    before = await raw(store)
    assert await store.extend(claim()) is Extended.LOST
    assert await raw(store) == before


# -- complete ------------------------------------------------------------------------------


async def test_complete_drops_the_steps(store: RedisStore) -> None:
    await stepped(store, steps=TWO)
    assert await store.complete(completion(response={"data": "x"})) is Written.RESPONSE
    item = await parsed(store)
    assert item["status"] == "COMPLETED" and "steps" not in item and "step_count" not in item
    record = (await store.get("k", now=time.time())).record
    assert record is not None and record.steps is None and record.response == {"data": "x"}


# -- release -------------------------------------------------------------------------------


async def test_release_keeps_the_steps_as_released(store: RedisStore) -> None:
    await stepped(store)
    before, px_before = await parsed(store), await expire_time(store)
    async with _client(store) as client:
        seconds, micros = await client.time()
    assert await store.release("k", "a") is True
    item = await parsed(store)
    assert "owner" not in item
    assert item["status"] == "INPROGRESS"
    assert (item["step_count"], item["steps"]) == (1, ONE)
    assert (item["expiration"], item["validation"]) == (before["expiration"], "h")
    # The lease ended one millisecond before the server's TIME, and the PX is untouched.
    server_ms = seconds * 1000 + micros // 1000
    assert server_ms - 2 <= item["in_progress_expiration"] <= server_ms + 1000
    assert item["in_progress_expiration"] < time.time() * 1000 + 5  # already ended
    assert await expire_time(store) == px_before
    verdict = await store.get("k", now=time.time())
    assert verdict.found is Found.CLAIMABLE
    # The released owner is fenced: nothing it still has in flight writes again.
    assert await store.record_step(write(TWO, 1)) is Stepped.LOST
    assert await store.extend(claim()) is Extended.LOST
    assert await store.complete(completion()) is Written.NOTHING
    # A release sent again (its answer lost) finds the key released.
    assert await store.release("k", "a") is True
    # Another owner's release of the released record answers released too.
    assert await store.release("k", "b") is True
    # And the next claim resumes at once.
    verdict = await store.claim(claim(owner="b"))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == ONE


async def test_release_without_steps_deletes(store: RedisStore) -> None:
    assert await store.claim(claim()) is CLAIMED
    assert await store.release("k", "a") is True
    assert await raw(store) is None


async def test_release_by_another_owner_leaves_the_steps(store: RedisStore) -> None:
    await stepped(store)
    before = await raw(store)
    assert await store.release("k", "b") is False
    assert await raw(store) == before


async def test_client_judged_release_ends_the_lease_long_ago(redis_server: RedisServer) -> None:
    # The manager's clock may be simulated: a released record is long past on any clock.
    async with fresh_redis_store(redis_server, judged_by="client") as store:
        now = 1_000_000.0
        assert await store.claim(claim(now=now)) is CLAIMED
        assert await store.record_step(write(ONE, 0, now=now)) is Stepped.RECORDED
        assert await store.release("k", "a") is True
        client = redis_server.client()
        try:
            item = json.loads(await client.get(store.key_prefix + "k"))
        finally:
            await client.aclose()
        assert item["in_progress_expiration"] == 1000
        verdict = await store.claim(claim(owner="b", now=now + 1))
        assert verdict.found is Found.CLAIMED and verdict.record is not None
        assert verdict.record.steps == ONE


# -- step ----------------------------------------------------------------------------------


async def test_step_is_owner_status_and_position_fenced(store: RedisStore) -> None:
    assert await store.record_step(write(ONE, 0)) is Stepped.LOST  # no record
    assert await store.claim(claim()) is CLAIMED
    assert await store.record_step(write(ONE, 0, owner="b")) is Stepped.LOST
    assert await store.record_step(write(ONE, 1)) is Stepped.LOST  # holds 0, not 1
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
    assert await store.record_step(write(TWO, 0)) is Stepped.LOST  # holds 1 now
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED  # the same list: resent
    assert await store.record_step(write(TWO, 1)) is Stepped.RECORDED
    assert (await parsed(store))["step_count"] == 2
    assert await store.complete(completion()) is Written.RESPONSE
    assert await store.record_step(write(TWO, 1)) is Stepped.LOST  # completed


async def test_step_moves_the_expiry_forward_never_the_lease_end(store: RedisStore) -> None:
    assert await store.claim(claim(ttl=100.0)) is CLAIMED
    before, ttl_before = await parsed(store), await pttl(store)
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED  # ttl 3600
    item = await parsed(store)
    assert item["in_progress_expiration"] == before["in_progress_expiration"]
    assert item["expiration"] >= before["expiration"] + 3400
    assert await pttl(store) > ttl_before + 3_000_000
    # A write whose ttl is shorter never moves the expiry (or the PX) back.
    short = StepWrite("k", "a", time.time(), 1.0, 1, TWO)
    ttl_now = await pttl(store)
    assert await store.record_step(short) is Stepped.RECORDED
    after = await parsed(store)
    assert after["expiration"] == item["expiration"]
    assert after["in_progress_expiration"] == before["in_progress_expiration"]
    # Moved back, the PX would be about 1 s; a loaded machine may take seconds between reads.
    assert await pttl(store) >= ttl_now - 30_000


async def test_step_never_shortens_the_keys_px(redis_server: RedisServer) -> None:
    # A client clock that jumped ahead: the record's expiry stays (never backwards), and
    # the key's PX must not shrink to what that clock computes from it.
    async with fresh_redis_store(redis_server, judged_by="client") as store:
        now = time.time()
        assert await store.claim(claim(now=now)) is CLAIMED
        px = await pttl(_standalone(store, redis_server))
        assert px > 3_500_000
        ahead = StepWrite("k", "a", now + 3000, 1.0, 0, ONE)
        assert await store.record_step(ahead) is Stepped.RECORDED
        assert await pttl(store) > px - 5_000


async def test_step_never_runs_the_expiry_before_the_lease_end(store: RedisStore) -> None:
    assert await store.claim(claim(lease=500.0, ttl=1.0)) is CLAIMED
    lease_end = (await parsed(store))["in_progress_expiration"]
    assert await store.record_step(StepWrite("k", "a", time.time(), 1.0, 0, ONE)) is (
        Stepped.RECORDED
    )
    item = await parsed(store)
    assert item["expiration"] * 1000 >= lease_end
    assert item["in_progress_expiration"] == lease_end


async def test_step_too_large_writes_nothing(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server, max_response_bytes=100) as store:
        assert await store.claim(claim()) is CLAIMED
        big = json.dumps([["a", "é" * 60]], ensure_ascii=False)  # 120+ bytes, < 100 chars
        assert await store.record_step(write(big, 0)) is Stepped.TOO_LARGE
        client = redis_server.client()
        try:
            item = json.loads(await client.get(store.key_prefix + "k"))
        finally:
            await client.aclose()
        assert "steps" not in item


async def test_a_step_write_resent_after_its_answer_was_lost(redis_server: RedisServer) -> None:
    async with lossy_proxy(redis_server.port) as proxy:
        client = redis_asyncio.Redis(host="127.0.0.1", port=proxy.port)  # default retries
        store = RedisStore(client, key_prefix=f"lossy{time.time_ns()}:")
        try:
            await client.ping()
            assert await store.claim(claim()) is CLAIMED
            # The write applied; its answer was lost; the client's resend meets the same list.
            proxy.lose_answers(1)
            assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
            assert proxy.answers_lost == 1
            proxy.lose_answers(1)
            assert await store.record_step(write(TWO, 1)) is Stepped.RECORDED
            assert proxy.answers_lost == 2
            record = (await store.get("k", now=time.time())).record
            assert record is not None and record.steps == TWO
            # The release, resent the same way, finds its released record.
            proxy.lose_answers(1)
            assert await store.release("k", "a") is True
            assert proxy.answers_lost == 3
            record = (await store.get("k", now=time.time())).record
            assert record is not None and record.owner is None and record.steps == TWO
        finally:
            await store.aclose()
            await client.aclose()


async def test_release_exactly_removes_only_the_progress_shown(store: RedisStore) -> None:
    await stepped(store)
    await store.release("k", "a")
    shown = (await store.get("k", now=time.time())).record
    assert shown is not None and shown.steps == ONE
    assert await store.release_exactly(shown._replace(steps=TWO)) is False
    assert await store.release_exactly(shown._replace(steps=None)) is False
    assert await raw(store) is not None
    assert await store.release_exactly(shown) is True
    assert await raw(store) is None


async def test_a_managers_step_write_resent_after_a_lost_answer(
    redis_server: RedisServer,
) -> None:
    async with lossy_proxy(redis_server.port) as proxy:
        client = redis_asyncio.Redis(host="127.0.0.1", port=proxy.port)  # default retries
        store = RedisStore(client, key_prefix=f"lossy{time.time_ns()}:")
        manager = _manager(store)
        ran: list[str] = []
        try:
            await client.ping()

            async def callback() -> list[int]:
                proxy.lose_answers(1)  # the next answer: the first step's write
                one = await step("one", lambda: asyncio.sleep(0, ran.append("one") or 1))
                assert proxy.answers_lost == 1
                two = await step("two", lambda: asyncio.sleep(0, ran.append("two") or 2))
                return [one, two]

            assert await manager.execute("resent", callback) == [1, 2]
            assert ran == ["one", "two"]
            assert await manager.execute("resent", callback) == [1, 2]
            assert ran == ["one", "two"]
        finally:
            await store.aclose()
            await client.aclose()


# -- hostile step lists --------------------------------------------------------------------


def _with(**fields: Any) -> dict[str, Any]:
    now = time.time()
    item: dict[str, Any] = {
        "status": "INPROGRESS",
        "expiration": int(now) + 3600,
        "in_progress_expiration": int((now - 10) * 1000),
        "validation": "h",
        "owner": "dead",
    }
    item.update(fields)
    return {name: value for name, value in item.items() if value is not None}


@pytest.mark.parametrize(
    "fields",
    [
        {"steps": ONE},  # no count
        {"step_count": 1},  # no list
        {"steps": ONE, "step_count": 2},  # a count that does not count the list
        {"steps": ONE, "step_count": 0},
        {"steps": ONE, "step_count": 65},
        {"steps": ONE, "step_count": 1.5},
        {"steps": ONE, "step_count": True},
        {"steps": ONE, "step_count": "1"},
        {"steps": json.loads(ONE), "step_count": 1},  # the list itself, not its text
        {"steps": '{"a":1}', "step_count": 1},  # not a list
    ],
)
async def test_a_malformed_step_list_is_unreadable_never_resumed(
    redis_server: RedisServer, fields: dict[str, Any]
) -> None:
    async with fresh_redis_store(redis_server) as store:
        await put(_standalone(store, redis_server), _with(**fields))
        before = await raw(store)
        with pytest.raises(errors.InconsistentStateError):
            await store.claim(claim(owner="b"))
        with pytest.raises(errors.InconsistentStateError):
            await store.get("k", now=time.time())
        assert await raw(store) == before


@pytest.mark.parametrize(
    "steps",
    [
        "[" + "[" * 600 + "]" * 600 + "]",  # the server's decoder accepts 1,000 levels
        "[[",  # the server leaves text it cannot decode to the client (lone surrogates)
    ],
)
async def test_a_list_only_the_client_refuses_is_never_resumed(
    redis_server: RedisServer, steps: str
) -> None:
    # The claim is written, then refused by the client: nothing runs, and every later
    # claim meets the same unreadable list.
    async with fresh_redis_store(redis_server) as store:
        await put(_standalone(store, redis_server), _with(steps=steps, step_count=1))
        for owner in ("b", "c"):
            with pytest.raises(errors.InconsistentStateError):
                await store.claim(claim(owner=owner))
        with pytest.raises(errors.InconsistentStateError):
            await store.get("k", now=time.time())
        assert (await parsed(store))["steps"] == steps


def _standalone(store: RedisStore, server: RedisServer) -> RedisStore:
    store.test_server = server  # type: ignore[attr-defined]
    store.test_cluster = False  # type: ignore[attr-defined]
    return store


async def test_a_step_list_past_the_bound_is_unreadable(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server, max_response_bytes=1000) as store:
        steps = json.dumps([["a", "x" * 2000]])
        await put(_standalone(store, redis_server), _with(steps=steps, step_count=1))
        with pytest.raises(errors.InconsistentStateError, match="longer"):
            await store.get("k", now=time.time())


async def test_steps_on_a_completed_record_are_unreadable(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        item = _with(status="COMPLETED", steps=ONE, step_count=1, in_progress_expiration=None)
        await put(_standalone(store, redis_server), item)
        with pytest.raises(errors.InconsistentStateError, match="COMPLETED"):
            await store.get("k", now=time.time())


async def test_a_result_shaped_like_data_never_moves_the_cut(store: RedisStore) -> None:
    # A result holding ',"data":' and a brace: the scripts still read the record's fields.
    nasty = encode_json([["a", {"x": ',"data":{}}', "data": [1, '"}']}]]).decode()
    assert await store.claim(claim()) is CLAIMED
    assert await store.record_step(write(nasty, 0)) is Stepped.RECORDED
    assert await store.extend(claim()) is Extended.RENEWED
    assert await store.release("k", "a") is True
    verdict = await store.claim(claim(owner="b"))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == nasty


async def test_a_lone_surrogate_in_a_result_resumes(store: RedisStore) -> None:
    # The manager writes a lone surrogate as its JSON escape, which the server's decoder
    # refuses: the claim leaves reading that list to the client.
    lone = encode_json([["a", "\ud800"]]).decode()
    assert await store.claim(claim()) is CLAIMED
    assert await store.record_step(write(lone, 0)) is Stepped.RECORDED
    assert await store.release("k", "a") is True
    verdict = await store.claim(claim(owner="b"))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == lone
    assert json.loads(lone) == [["a", "\ud800"]]


# -- through a Manager -----------------------------------------------------------------------


class Boom(Exception):
    pass


def _manager(store: RedisStore, **options: Any) -> Manager:
    return Manager(store, Options(**options))


async def test_a_call_that_raises_after_a_step_resumes_there(store: RedisStore) -> None:
    manager = _manager(store)
    ran: list[str] = []

    async def effect(name: str) -> dict[str, str]:
        ran.append(name)
        return {"done": name}

    async def callback(fail_after: int | None) -> list[Any]:
        results = []
        for n, name in enumerate(["one", "two", "three"]):
            results.append(await step(name, lambda name=name: effect(name)))
            if fail_after == n + 1:
                raise Boom
        return results

    with pytest.raises(Boom):
        await manager.execute({"id": 1}, lambda: callback(2))
    assert ran == ["one", "two"]
    key = manager.key_for({"id": 1})
    assert key is not None
    item = await parsed(store, key)
    assert "owner" not in item and item["step_count"] == 2  # released, progress kept
    result = await manager.execute({"id": 1}, lambda: callback(None))
    assert ran == ["one", "two", "three"]  # the retry ran the third step only
    assert result == [{"done": "one"}, {"done": "two"}, {"done": "three"}]
    item = await parsed(store, key)
    assert item["status"] == "COMPLETED" and "steps" not in item
    assert await manager.execute({"id": 1}, lambda: callback(None)) == result
    assert ran == ["one", "two", "three"]


async def test_another_payload_cannot_resume_the_progress(store: RedisStore) -> None:
    manager = _manager(store, event_key_jmespath="id", payload_validation_jmespath="amount")

    async def callback() -> None:
        await step("charge", lambda: asyncio.sleep(0, "charged"))
        raise Boom

    with pytest.raises(Boom):
        await manager.execute({"id": 1, "amount": 5}, callback)
    with pytest.raises(errors.PayloadValidationError):
        await manager.execute({"id": 1, "amount": 6}, callback)


async def test_a_renewed_call_keeps_its_steps_across_renewals(store: RedisStore) -> None:
    # A lease long enough that a loaded machine (the cluster client opening connections
    # for the test's own reads) does not cut the call off; renewed every 0.1 s all the same.
    manager = _manager(store, renewal=Renewal(lease=2.0, every=0.1))
    key = manager.key_for("renewed")
    assert key is not None
    lease_ends: set[int] = set()

    async def callback() -> str:
        await step("one", lambda: asyncio.sleep(0, 1))
        for _ in range(20):  # renewals land after the step, each moving the lease end
            await asyncio.sleep(0.05)
            item = await parsed(store, key)
            assert (item["step_count"], item["owner"] is not None) == (1, True)
            lease_ends.add(item["in_progress_expiration"])
        raise Boom

    with pytest.raises(Boom):
        await manager.execute("renewed", callback)
    assert len(lease_ends) >= 4, "the lease was not renewed while the steps were held"
    item = await parsed(store, key)
    assert item["step_count"] == 1 and "owner" not in item
    ran: list[int] = []

    async def again() -> int:
        value = await step("one", lambda: asyncio.sleep(0, ran.append(1) or 2))
        return int(value)

    assert await manager.execute("renewed", again) == 1
    assert ran == []


async def test_an_expired_records_steps_run_again(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        manager = _manager(store, expires_after=1.0)
        ran: list[str] = []

        async def callback(fail: bool) -> str:
            await step("one", lambda: asyncio.sleep(0, ran.append("one") or "x"))
            if fail:
                raise Boom
            return "done"

        with pytest.raises(Boom):
            await manager.execute("expiring", lambda: callback(True))
        await asyncio.sleep(2.1)  # past the expiry (and the key's PX, a second later)
        assert await manager.execute("expiring", lambda: callback(False)) == "done"
        assert ran == ["one", "one"]


async def test_a_released_call_with_steps_wakes_its_waiters(redis_server: RedisServer) -> None:
    prefix = f"w{time.time_ns()}:"
    async with (
        fresh_redis_store(redis_server, key_prefix=prefix) as holder_store,
        fresh_redis_store(redis_server, key_prefix=prefix) as waiter_store,
    ):
        holder = _manager(holder_store)
        waiter = _manager(waiter_store, wait=Wait(timeout=20.0))
        stepped_event, release = asyncio.Event(), asyncio.Event()
        ran: list[str] = []
        resumed_at: list[float] = []

        async def first() -> str:
            await step("one", lambda: asyncio.sleep(0, ran.append("first") or 1))
            stepped_event.set()
            await release.wait()
            raise Boom

        async def second() -> str:
            await step("one", lambda: asyncio.sleep(0, ran.append("second") or 1))
            resumed_at.append(time.monotonic())
            return "resumed"

        holding = asyncio.create_task(holder.execute("woken", first))
        await stepped_event.wait()
        waiting = asyncio.create_task(waiter.execute("woken", second))
        end = time.monotonic() + 5
        while not (waiter_store._wakeups is not None and waiter_store._wakeups.live):
            assert time.monotonic() < end, "the waiter never subscribed"
            await asyncio.sleep(0.01)
        # Long enough that the waiter's next poll is over a second away: only the
        # release's PUBLISH wakes it within half a second.
        await asyncio.sleep(1.7)
        release.set()
        with pytest.raises(Boom):
            await holding
        released = time.monotonic()
        assert await waiting == "resumed"
        assert resumed_at[0] - released < 0.5
        assert ran == ["first"]  # the waiter resumed the released progress


async def test_a_release_with_steps_publishes_released(store: RedisStore) -> None:
    await stepped(store)
    if store.test_cluster:  # type: ignore[attr-defined]
        # A cluster store publishes nothing (PUBLISH crosses every node): the release
        # still keeps the progress.
        assert await store.release("k", "a") is True
        assert (await parsed(store))["step_count"] == 1
        return
    async with _client(store) as client:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(store.key_prefix + "k")
            assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
            assert await store.release("k", "a") is True
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            assert message is not None and message["data"] == b"released"
            assert (await parsed(store))["step_count"] == 1  # released, not deleted
        finally:
            await pubsub.aclose()


async def test_a_manager_resumes_a_crashed_holders_steps(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        manager = _manager(store)
        key = manager.key_for("crashed")
        assert key is not None
        # A holder that recorded a step and died: its lease lapsed, its record stays.
        lapsed = Claim(key, "dead", time.time(), 0.05, TTL, None)
        assert await store.claim(lapsed) is CLAIMED
        entry = encode_json([["one", {"n": 1}]]).decode()
        assert await store.record_step(StepWrite(key, "dead", time.time(), TTL, 0, entry)) is (
            Stepped.RECORDED
        )
        await asyncio.sleep(0.1)
        ran: list[str] = []

        async def callback() -> Any:
            one = await step("one", lambda: asyncio.sleep(0, ran.append("one") or {"n": 0}))
            two = await step("two", lambda: asyncio.sleep(0, ran.append("two") or 2))
            return [one, two]

        assert await manager.execute("crashed", callback) == [{"n": 1}, 2]
        assert ran == ["two"]


async def test_powertools_python_format_records_steps_too(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server, record_format="powertools-python") as store:
        manager = _manager(store, key_format="powertools-python")
        ran: list[str] = []

        async def callback(fail: bool) -> str:
            await step("one", lambda: asyncio.sleep(0, ran.append("one") or 1))
            if fail:
                raise Boom
            return "done"

        with pytest.raises(Boom):
            await manager.execute({"x": 1}, lambda: callback(True))
        assert await manager.execute({"x": 1}, lambda: callback(False)) == "done"
        assert ran == ["one"]
        key = manager.key_for({"x": 1})
        assert key is not None
        client = redis_server.client()
        try:
            item = json.loads(await client.get(store.key_prefix + key))
        finally:
            await client.aclose()
        assert item["status"] == "COMPLETED" and "steps" not in item
        assert json.loads(item["data"]) == "done"


async def test_powertools_python_format_answers_resumable_without_the_lock(
    redis_server: RedisServer,
) -> None:
    async with fresh_redis_store(redis_server, record_format="powertools-python") as store:
        _standalone(store, redis_server)
        await stepped(store)
        assert await store.release("k", "a") is True
        verdict = await store.claim(claim(owner="b", validation="other"))
        assert verdict.found is Found.RESUMABLE
        async with _client(store) as client:
            assert not await client.exists(store.key_prefix + "k:lock")  # nothing taken
        verdict = await store.claim(claim(owner="b"))
        assert verdict.found is Found.CLAIMED and verdict.record is not None
        assert verdict.record.steps == ONE
        async with _client(store) as client:
            assert await client.exists(store.key_prefix + "k:lock")  # taken, as Powertools


async def test_a_step_result_past_the_bound_is_recorded_not_stored(
    redis_server: RedisServer,
) -> None:
    async with fresh_redis_store(redis_server, max_response_bytes=200) as store:
        manager = _manager(store)
        ran: list[str] = []
        refused: list[str] = []

        async def callback() -> str:
            try:
                await step("big", lambda: asyncio.sleep(0, ran.append("big") or "x" * 500))
            except errors.StepResultNotStoredError as exc:
                refused.append(exc.step)
            raise Boom

        with pytest.raises(Boom):
            await manager.execute("big", callback)
        key = manager.key_for("big")
        assert key is not None
        async with _client(_standalone(store, redis_server)) as client:
            item = json.loads(await client.get(store.key_prefix + key))
        (entry,) = json.loads(item["steps"])
        assert entry[:2] == ["big", None] and "limit" in entry[2]
        with pytest.raises(Boom):
            await manager.execute("big", callback)
        assert ran == ["big"]  # not stored, and not run again
        assert refused == ["big", "big"]  # now and on the resume


async def test_status_of_a_resumed_record_is_in_progress(store: RedisStore) -> None:
    await stepped(store)
    await store.release("k", "a")
    record = (await store.get("k", now=time.time())).record
    assert record is not None and record.status is Status.INPROGRESS
