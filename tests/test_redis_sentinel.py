"""RedisStore on a Sentinel master: a primary, a replica and one sentinel, then a failover.

After the failover the new primary has never seen the store's scripts (Redis does not
replicate its script cache): the store reloads them, and a claim the replica acknowledged
(``min_replicas=1``) is still held after the failover.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from _redis import start_redis, start_sentinel, stop_redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ResponseError

from idempotency_async import errors
from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import CLAIMED, Found, Written
from idempotency_async.stores.redis import _CLAIM, RedisStore

pytestmark = pytest.mark.redis


def claim(key: str, owner: str = "a") -> Claim:
    # A lease longer than the failover may take on a loaded machine (up to 40 s of waits
    # below): "held" must still be held when it is checked on the new primary.
    return Claim(key, owner, time.time(), 300.0, 3600.0, None)


async def test_a_sentinel_master_survives_a_failover() -> None:
    primary = start_redis()
    replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
    sentinel_server = start_sentinel(primary)
    sentinel = Sentinel([("127.0.0.1", sentinel_server.port)], socket_timeout=2)
    client = sentinel.master_for("mymaster", socket_timeout=2)
    try:
        async with replica.client() as reader:
            deadline = time.monotonic() + 10
            while (await reader.info("replication"))["master_link_status"] != "up":
                assert time.monotonic() < deadline, "the replica did not connect"
                await asyncio.sleep(0.05)
        # A generous WAIT: on a loaded machine a replica can take a while to acknowledge.
        store = RedisStore(client, key_prefix="s:", min_replicas=1, replica_timeout=1.5)
        assert await store.claim(claim("held")) is CLAIMED
        assert await store.claim(claim("done")) is CLAIMED
        done = Completion("done", "a", time.time(), 3600.0, None, encode_json([1, 2]), [1, 2])
        assert await store.complete(done) is Written.RESPONSE

        async with replica.client() as reader:
            # Redis does not replicate its script cache: the new primary will lack them.
            assert await reader.script_exists(_CLAIM.sha) == [False]
        deadline = time.monotonic() + 20
        async with sentinel_server.client() as admin:
            while True:
                try:
                    await admin.execute_command("SENTINEL", "FAILOVER", "mymaster")
                    break
                except ResponseError as exc:
                    # NOGOODSLAVE until the sentinel has discovered the replica.
                    assert time.monotonic() < deadline, str(exc)
                    await asyncio.sleep(0.1)
        while (await sentinel.discover_master("mymaster"))[1] != replica.port:
            assert time.monotonic() < deadline, "the sentinel did not fail over"
            await asyncio.sleep(0.1)

        # The claim is held on the new primary; the scripts are reloaded transparently.
        deadline = time.monotonic() + 20
        while True:
            try:
                verdict = await store.claim(claim("held", owner="b"))
                break
            except errors.StoreUnavailableError:
                # The demoted primary refuses writes until the client follows the sentinel.
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.record is not None and verdict.record.owner == "a"
        replay = await store.claim(claim("done", owner="b"))
        assert replay.found is Found.COMPLETED and replay.record is not None
        assert replay.record.response == [1, 2]
    finally:
        await client.aclose()
        for sentinel_client in sentinel.sentinels:
            await sentinel_client.aclose()
        stop_redis(sentinel_server)
        stop_redis(replica)
        stop_redis(primary)
