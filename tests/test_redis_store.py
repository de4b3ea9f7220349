"""RedisStore on real redis-server processes: layout, clocks, TTLs, faults, cluster, clients.

The store contract suite runs on Redis through the ``store`` fixture (conftest.py); this
file covers what is Redis-specific.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import RedisServer, fresh_redis_store, start_cluster, start_redis, stop_redis
from _tcp_proxy import lossy_proxy
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from idempotency_async import errors
from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores._redis_gate import Gate
from idempotency_async.stores.base import CLAIMED, Found, Verdict, Written
from idempotency_async.stores.redis import RedisStore

pytestmark = pytest.mark.redis

LEASE, TTL = 30.0, 3600.0


def claim(key: str = "k", owner: str = "a", now: float | None = None, **kw: Any) -> Claim:
    return Claim(key, owner, time.time() if now is None else now, kw.get("lease", LEASE), TTL, "h")


def completion(
    key: str = "k", owner: str = "a", response: Any = 1, now: float | None = None
) -> Completion:
    now = time.time() if now is None else now
    return Completion(key, owner, now, TTL, "h", encode_json(response), response)


async def raw_record(server: RedisServer, store: RedisStore, key: str = "k") -> dict[str, Any]:
    async with server.client() as client:
        raw = await client.get(store.key_prefix + key)
    assert raw is not None
    parsed: dict[str, Any] = json.loads(raw)
    return parsed


async def pttl(server: RedisServer, store: RedisStore, key: str = "k") -> int:
    async with server.client() as client:
        return int(await client.pttl(store.key_prefix + key))


# -- record layout and TTL -------------------------------------------------------------


async def test_records_use_the_typescript_layout_with_a_ttl(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        before = time.time()
        assert await store.claim(claim()) is CLAIMED
        item = await raw_record(redis_server, store)
        assert set(item) == {
            "status",
            "expiration",
            "in_progress_expiration",
            "validation",
            "owner",
        }
        assert item["status"] == "INPROGRESS" and item["owner"] == "a" and item["validation"] == "h"
        assert isinstance(item["expiration"], int) and isinstance(
            item["in_progress_expiration"], int
        )
        assert before + TTL - 1 <= item["expiration"] <= time.time() + TTL + 1
        assert abs(item["in_progress_expiration"] / 1000 - (before + LEASE)) < 1
        assert 0 < await pttl(redis_server, store) <= (TTL + 2) * 1000

        assert await store.complete(completion(response={"n": [1, 2.5]})) is Written.RESPONSE
        item = await raw_record(redis_server, store)
        assert item == {
            "status": "COMPLETED",
            "expiration": item["expiration"],
            "validation": "h",
            "owner": "a",
            "data": {"n": [1, 2.5]},
        }
        assert TTL * 1000 - 3000 < await pttl(redis_server, store) <= (TTL + 2) * 1000


async def test_not_stored_marker_rides_in_data_format(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        await store.claim(claim())
        bare = Completion("k", "a", time.time(), TTL, None, None, None, "stream")
        assert await store.complete(bare) is Written.WITHOUT_RESPONSE
        item = await raw_record(redis_server, store)
        assert "data" not in item and item["data_format"] == "not-stored: stream"


async def test_a_response_above_max_response_bytes_is_stored_without_it(
    redis_server: RedisServer,
) -> None:
    async with fresh_redis_store(redis_server, max_response_bytes=100) as store:
        await store.claim(claim())
        assert await store.complete(completion(response="x" * 200)) is Written.WITHOUT_RESPONSE
        record = (await store.get("k", now=time.time())).record
        assert record is not None and record.response_stored is False
        assert record.not_stored is not None and "max_response_bytes" in record.not_stored


async def test_typescript_records_are_read_and_judged(redis_server: RedisServer) -> None:
    # Text as the TypeScript CachePersistenceLayer writes it (JSON.stringify, no owner).
    now = time.time()
    async with fresh_redis_store(redis_server) as store, redis_server.client() as client:
        in_progress = {
            "status": "INPROGRESS",
            "expiration": math.floor(now) + 3600,
            "in_progress_expiration": math.floor(now * 1000) + 60_000,
            "validation": "h",
        }
        await client.set(store.key_prefix + "ts-1", json.dumps(in_progress, separators=(",", ":")))
        verdict = await store.claim(claim("ts-1"))
        assert verdict.found is Found.IN_PROGRESS and verdict.record is not None
        assert verdict.record.owner is None and verdict.retry_after is not None
        assert 55 < verdict.retry_after <= 60

        lapsed = {**in_progress, "in_progress_expiration": math.floor(now * 1000) - 1}
        await client.set(store.key_prefix + "ts-2", json.dumps(lapsed))
        assert await store.claim(claim("ts-2")) is CLAIMED

        done = '{"status":"COMPLETED","expiration":%d,"data":{"a":[1,"x"],"data":2}}' % (now + 60)  # noqa: UP031
        await client.set(store.key_prefix + "ts-3", done)
        verdict = await store.claim(claim("ts-3"))
        assert verdict.found is Found.COMPLETED and verdict.record is not None
        assert verdict.record.response == {"a": [1, "x"], "data": 2}
        assert verdict.record.validation is None
        # Built positionally (a replay's cost): every field of a Verdict, in its order.
        assert len(verdict) == len(Verdict._fields) and verdict.retry_after is None
        assert verdict.expires_in is not None and 55 < verdict.expires_in <= 61

        # No data: the TypeScript callback returned undefined.
        bare = '{"status":"COMPLETED","expiration":%d}' % (now + 60)  # noqa: UP031
        await client.set(store.key_prefix + "ts-4", bare)
        record = (await store.get("ts-4", now=now)).record
        assert record is not None and record.response is None and record.response_stored

        # Members in another order (Python's json.dumps with data first).
        reordered = json.dumps({"data": {"x": 1}, "status": "COMPLETED", "expiration": now + 60})
        await client.set(store.key_prefix + "ts-5", reordered)
        verdict = await store.claim(claim("ts-5"))
        assert verdict.found is Found.COMPLETED and verdict.record is not None
        assert verdict.record.response == {"x": 1}


async def test_unreadable_records_are_inconsistent_state(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store, redis_server.client() as client:
        await client.set(store.key_prefix + "bad", b"not json")
        with pytest.raises(errors.InconsistentStateError, match="force_release"):
            await store.claim(claim("bad"))
        with pytest.raises(errors.InconsistentStateError, match="cannot be read"):
            await store.get("bad", now=time.time())
        with pytest.raises(errors.InconsistentStateError, match="was deleted"):
            await store.force_release("bad")
        assert await client.exists(store.key_prefix + "bad") == 0

        await client.hset(store.key_prefix + "hash", "a", "b")
        with pytest.raises(errors.StoreValidationError, match="key_prefix"):
            await store.claim(claim("hash"))


# -- clocks --------------------------------------------------------------------------


async def test_server_clock_ignores_the_clients_now(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store:
        ahead, behind = time.time() + 120, time.time() - 120
        assert await store.claim(claim(owner="a", now=behind, lease=5)) is CLAIMED
        record = (await store.get("k", now=0)).record
        assert record is not None and record.lease_end is not None
        assert abs(record.lease_end - (time.time() + 5)) < 1  # by TIME, not by `behind`
        # A worker two minutes ahead cannot take the live lease.
        verdict = await store.claim(claim(owner="b", now=ahead))
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.retry_after is not None and 4 < verdict.retry_after <= 5.01
        assert (await store.get("k", now=ahead)).found is Found.IN_PROGRESS
        assert await store.complete(completion(owner="a", now=behind)) is Written.RESPONSE
        item = await raw_record(redis_server, store)
        assert abs(item["expiration"] - (time.time() + TTL)) < 2


async def test_client_clock_uses_the_managers_now(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server, judged_by="client") as store:
        past = 1_700_000_000.0
        await store.claim(claim(now=past, lease=5))
        item = await raw_record(redis_server, store)
        assert item["in_progress_expiration"] == (past + 5) * 1000
        # The key's TTL is a duration, so it lives although its instants are in the past.
        assert await pttl(redis_server, store) > (TTL - 5) * 1000
        assert (await store.claim(claim(owner="b", now=past + 6))).found is Found.CLAIMED


# -- faults --------------------------------------------------------------------------


async def test_script_flush_mid_run_reloads_the_scripts(redis_server: RedisServer) -> None:
    async with fresh_redis_store(redis_server) as store, redis_server.client() as admin:
        assert await store.claim(claim("a")) is CLAIMED
        await admin.script_flush()
        assert (await store.claim(claim("a", owner="b"))).found is Found.IN_PROGRESS
        await admin.script_flush()
        assert await store.complete(completion("a")) is Written.RESPONSE
        await admin.script_flush()
        assert (await store.get("a", now=time.time())).found is Found.COMPLETED
        await admin.script_flush()
        assert await store.release("a", "b") is False
        await admin.script_flush()
        assert (await store.force_release("a")) is not None


async def test_script_flush_on_a_cluster_reloads_the_scripts(redis_cluster: RedisServer) -> None:
    async with fresh_redis_store(redis_cluster, cluster=True) as store:
        assert await store.claim(claim("a")) is CLAIMED
        for port in redis_cluster.ports:
            redis_cluster.cli("script", "flush", port=port)
        assert await store.complete(completion("a")) is Written.RESPONSE


async def test_answers_lost_after_the_script_ran_are_retried_safely(
    redis_server: RedisServer,
) -> None:
    async with lossy_proxy(redis_server.port) as proxy:
        client = redis_asyncio.Redis(host="127.0.0.1", port=proxy.port)  # default retries
        store = RedisStore(client, key_prefix=f"lossy{time.time_ns()}:")
        try:
            await client.ping()
            # The claim ran; its answer was lost; the client's retry meets its own token.
            proxy.lose_answers(1)
            assert await store.claim(claim("k")) is CLAIMED
            assert proxy.answers_lost == 1
            # A retried completion by the same owner succeeds again.
            proxy.lose_answers(1)
            assert await store.complete(completion("k", response="once")) is Written.RESPONSE
            record = (await store.get("k", now=time.time())).record
            assert record is not None and record.response == "once"
            # A retried release of the key it already deleted counts as released.
            await store.claim(claim("r"))
            proxy.lose_answers(1)
            assert await store.release("r", "a") is True
            assert (await store.get("r", now=time.time())).record is None
            assert proxy.answers_lost == 3
            # A second owner still cannot take the completed key.
            assert (await store.claim(claim("k", owner="b"))).found is Found.COMPLETED
        finally:
            await client.aclose()


async def test_an_unreachable_server_is_store_unavailable() -> None:
    server = start_redis()
    port = server.port
    stop_redis(server)
    client = redis_asyncio.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    store = RedisStore(client)
    try:
        with pytest.raises(errors.StoreUnavailableError, match="did not answer"):
            await store.claim(claim())
    finally:
        await client.aclose()


@pytest.mark.parametrize("package", ["redis", "valkey"])
async def test_a_cluster_client_on_a_dead_port_is_store_unavailable(package: str) -> None:
    # Both clients raise <Name>ClusterException here, which is not a RedisError/ValkeyError.
    cluster_class = (
        redis_asyncio.RedisCluster
        if package == "redis"
        else pytest.importorskip("valkey.asyncio").ValkeyCluster
    )
    server = start_redis()
    port = server.port
    stop_redis(server)
    client = cluster_class(host="127.0.0.1", port=port, socket_connect_timeout=1)
    store = RedisStore(client)
    try:
        with pytest.raises(errors.StoreUnavailableError, match="did not answer") as raised:
            await store.claim(claim())
        assert type(raised.value.__cause__).__name__.endswith("ClusterException")
        with pytest.raises(errors.StoreUnavailableError):
            await store.get("k", now=time.time())
    finally:
        await client.aclose()


async def test_a_cluster_whose_nodes_stopped_is_store_unavailable() -> None:
    cluster = start_cluster()
    stopped = False
    try:
        async with fresh_redis_store(cluster, cluster=True) as store:
            assert await store.claim(claim("before")) is CLAIMED
            stop_redis(RedisServer(cluster.ports, cluster.processes))
            stopped = True
            for operation in (
                lambda: store.claim(claim("after")),
                lambda: store.get("before", now=time.time()),
                lambda: store.force_release("before"),
            ):
                with pytest.raises(errors.StoreUnavailableError):
                    await operation()
    finally:
        if not stopped:
            stop_redis(cluster)
        else:
            stop_redis(RedisServer([], [], cluster.directory))


# -- clients and configuration ---------------------------------------------------------


async def test_decode_responses_clients_work(redis_server: RedisServer) -> None:
    client = redis_server.client(decode_responses=True)
    store = RedisStore(client, key_prefix=f"dec{time.time_ns()}:")
    try:
        await store.claim(claim())
        assert (await store.claim(claim(owner="b"))).found is Found.IN_PROGRESS
        value = {"wide": 2**70, "text": "café"}
        assert await store.complete(completion(response=value)) is Written.RESPONSE
        verdict = await store.claim(claim(owner="b"))
        assert verdict.record is not None and verdict.record.response == value
    finally:
        await client.aclose()


async def test_from_url_owns_and_closes_its_client(redis_server: RedisServer) -> None:
    async with RedisStore.from_url(redis_server.url, key_prefix=f"url{time.time_ns()}:") as store:
        assert await store.claim(claim()) is CLAIMED
        client = store._client
    assert client.connection_pool._in_use_connections == set()
    with pytest.raises(errors.ConfigError, match="closed"):
        await store.claim(claim())


async def test_a_callers_client_stays_open(redis_server: RedisServer) -> None:
    async with redis_server.client() as client:
        async with RedisStore(client, key_prefix=f"own{time.time_ns()}:") as store:
            await store.claim(claim())
        assert await client.ping() is True


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RedisStore(object()), "asyncio Redis client"),
        (lambda: RedisStore.from_url("http://localhost"), "redis://"),
        (lambda: RedisStore.from_url("redis://x", judged_by="wall"), "judged_by"),  # type: ignore[arg-type]
        (lambda: RedisStore.from_url("redis://x", max_response_bytes=0), "positive"),
        (lambda: RedisStore.from_url("redis://x", min_replicas=-1), "min_replicas"),
        (lambda: RedisStore.from_url("redis://x", cluster=True, min_replicas=1), "Cluster"),
    ],
)
async def test_bad_configuration_is_a_config_error(make: Any, match: str) -> None:
    with pytest.raises(errors.ConfigError, match=match):
        store = make()
        await store.aclose()


async def test_valkey_client(redis_server: RedisServer) -> None:
    valkey_asyncio = pytest.importorskip("valkey.asyncio")
    client = valkey_asyncio.Valkey(host="127.0.0.1", port=redis_server.port)
    store = RedisStore(client, key_prefix=f"valkey{time.time_ns()}:")
    try:
        assert await store.claim(claim()) is CLAIMED
        await client.script_flush()
        assert (await store.claim(claim(owner="b"))).found is Found.IN_PROGRESS
        assert await store.complete(completion(response=[1.5, 2**64])) is Written.RESPONSE
        record = (await store.get("k", now=time.time())).record
        assert record is not None and record.response == [1.5, 2**64]
        assert await store.release("k", "b") is False
    finally:
        await client.aclose()


# -- cluster -------------------------------------------------------------------------


async def test_cluster_keys_spread_over_every_master(redis_cluster: RedisServer) -> None:
    async with fresh_redis_store(redis_cluster, cluster=True) as store:
        keys = [f"fn#{n:04x}" for n in range(30)]
        verdicts = await asyncio.gather(*(store.claim(claim(key)) for key in keys))
        assert all(verdict is CLAIMED for verdict in verdicts)
        holding = [
            int(redis_cluster.cli("dbsize", port=port).strip() or 0) for port in redis_cluster.ports
        ]
        assert all(count > 0 for count in holding), holding
        written = await asyncio.gather(*(store.complete(completion(key)) for key in keys))
        assert set(written) == {Written.RESPONSE}
        released = await asyncio.gather(*(store.force_release(key) for key in keys))
        assert all(r is not None and r.status is Status.COMPLETED for r in released)


async def test_a_fresh_cluster_client_takes_concurrent_first_calls(
    redis_cluster: RedisServer,
) -> None:
    async with fresh_redis_store(redis_cluster, cluster=True) as store:
        verdicts = await asyncio.gather(*(store.claim(claim(f"c{n}")) for n in range(20)))
        assert all(verdict is CLAIMED for verdict in verdicts)


# -- replicas ------------------------------------------------------------------------


async def test_min_replicas_confirms_a_claim_on_a_replica(redis_server: RedisServer) -> None:
    primary = start_redis()
    replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
    try:
        async with primary.client() as client, replica.client() as reader:
            deadline = time.monotonic() + 10
            while (await reader.info("replication"))["master_link_status"] != "up":
                assert time.monotonic() < deadline, "the replica did not connect"
                await asyncio.sleep(0.05)
            store = RedisStore(client, min_replicas=1, replica_timeout=2)
            assert await store.claim(claim()) is CLAIMED
            assert await reader.get("k") is not None  # on the replica already
            assert (await store.claim(claim(owner="b"))).found is Found.IN_PROGRESS
            demanding = RedisStore(client, min_replicas=2, replica_timeout=0.1)
            with pytest.raises(errors.StoreUnavailableError, match="fewer than min_replicas"):
                await demanding.claim(claim("k2"))
            await client.script_flush()
            assert await store.claim(claim("k3")) is CLAIMED
    finally:
        stop_redis(replica)
        stop_redis(primary)


async def test_more_concurrent_calls_than_pooled_connections_queue(
    redis_server: RedisServer,
) -> None:
    # redis-py's default pool fails the command that finds every connection in use.
    async with redis_server.client(max_connections=4) as client:
        store = RedisStore(client, key_prefix=f"pool{time.time_ns()}:")
        keys = [f"p{n}" for n in range(200)]
        verdicts = await asyncio.gather(*(store.claim(claim(key)) for key in keys))
        assert all(verdict is CLAIMED for verdict in verdicts)
        written = await asyncio.gather(*(store.complete(completion(key)) for key in keys))
        assert set(written) == {Written.RESPONSE}
        assert len(client.connection_pool._available_connections) <= 4


async def test_commands_cancelled_or_failed_at_any_turn_leave_every_slot_free(
    redis_server: RedisServer,
) -> None:
    # Two connections, one of them the pub/sub one: the store sends one command at a time.
    async with redis_server.client(max_connections=2) as client:
        store = RedisStore(client, key_prefix=f"gate{time.time_ns()}:")
        await store.load_scripts()
        gate = store._gate
        assert gate is not None and gate.free == 1
        await client.rpush(store.key_prefix + "list", "x")  # WRONGTYPE for every script
        for turns in range(12):
            tasks = [asyncio.create_task(store.claim(claim(f"g{turns}-{n}"))) for n in range(6)]
            tasks.append(asyncio.create_task(store.claim(claim("list"))))
            for _ in range(turns):
                await asyncio.sleep(0)
            for task in tasks[turns % 2 :: 2]:  # the command on the wire among them, in turn
                task.cancel()
            async with asyncio.timeout(10):  # a slot lost: the rest would wait for ever
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for task, outcome in zip(tasks, outcomes, strict=True):
                failed = isinstance(outcome, asyncio.CancelledError | errors.StoreValidationError)
                assert outcome is CLAIMED or failed, outcome
                assert task.cancelled() or not isinstance(outcome, asyncio.CancelledError)
            assert gate.free == 1 and not gate.waiters, turns
        async with asyncio.timeout(10):
            assert await store.claim(claim("after")) is CLAIMED


async def test_the_gate_passes_on_a_slot_handed_to_a_waiter_cancelled_before_it_ran() -> None:
    gate = Gate(1)
    async with gate:
        first, second, third = (asyncio.create_task(gate.wait()) for _ in range(3))
        await asyncio.sleep(0)  # all three queued, in order
    # The slot went to the first waiter; cancelled before it ran, it passes it on.
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):  # passed on, not lost
        await second  # holds the slot now
    third.cancel()  # still queued: it leaves the queue
    with pytest.raises(asyncio.CancelledError):
        await third
    assert gate.free == 0 and not gate.waiters
    gate.release()
    assert gate.free == 1


async def test_the_documented_minimal_acl_user_can_run_the_store(
    redis_server: RedisServer,
) -> None:
    user = f"idem{time.time_ns()}"
    async with redis_server.client() as admin:
        # As docs/redis.md gives it, for keys starting with "orders#".
        await admin.execute_command(
            "ACL", "SETUSER", user, "on", ">secret", "~orders#*",
            "+evalsha", "+script|load", "+get", "+set", "+del", "+time", "+wait",
        )  # fmt: skip
    url = f"redis://{user}:secret@127.0.0.1:{redis_server.port}/0"
    async with RedisStore.from_url(url) as store:
        assert await store.claim(claim("orders#1")) is CLAIMED
        assert await store.complete(completion("orders#1")) is Written.RESPONSE
        assert (await store.get("orders#1", now=0)).found is Found.COMPLETED
        assert await store.release("orders#2", "a") is True
        assert await store.force_release("orders#1") is not None
        with pytest.raises(errors.StoreAccessDeniedError):
            await store.claim(claim("other#1"))


async def test_responses_that_look_like_record_members_round_trip(
    redis_server: RedisServer,
) -> None:
    tricky = {"data": {"data": ',"data":1}', "status": "INPROGRESS"}, "owner": 'x\\","data":'}
    async with fresh_redis_store(redis_server) as store:
        await store.claim(claim())
        assert await store.complete(completion(response=tricky)) is Written.RESPONSE
        verdict = await store.claim(claim(owner="b"))
        assert verdict.found is Found.COMPLETED and verdict.record is not None
        assert verdict.record.response == tricky and verdict.record.owner == "a"
        assert await store.release("k", "b") is False
        assert await store.complete(completion(owner="b")) is Written.NOTHING


async def test_from_url_builds_a_cluster_client(redis_cluster: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_cluster.port}"
    async with RedisStore.from_url(url, cluster=True, key_prefix=f"u{time.time_ns()}:") as store:
        verdicts = await asyncio.gather(*(store.claim(claim(f"k{n}")) for n in range(10)))
        assert all(verdict is CLAIMED for verdict in verdicts)
        assert type(store._client).__name__ == "RedisCluster"
