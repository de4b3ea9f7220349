"""A Redis Cluster moving a slot while idempotent calls hit it.

The slot is moved as ``redis-cli --cluster reshard`` moves it: the target marks it
IMPORTING, the source MIGRATING, the keys go over with ``MIGRATE``, and every node is told
the new owner (``CLUSTER SETSLOT … NODE``).  Calls meanwhile meet ASK and MOVED
redirections; redis-py's cluster client reloads its slot map after MOVED by closing every
connection, which fails commands that are connecting at that moment with a bare
``AttributeError``.  The store must answer every failure of its client with a typed
store error (G5), and resend what it safely can.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
import redis
from _redis import RedisServer
from redis.crc import key_slot

from idempotency_async import Manager, Options, errors
from idempotency_async.record import Status
from idempotency_async.stores.redis import RedisStore

# Every record in one slot (a hash tag), so every call meets the migration.
PREFIX = "{reshard}:"
WORKERS = 24
MOVES = 8
# Each worker cycles over a few payloads (first calls, then replays): the slot keeps few
# keys, so each move is quick and the test makes several.
PAYLOADS = 20


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port)


def _ids(cluster: RedisServer) -> dict[int, str]:
    ids = {}
    for port in cluster.ports:
        with _node(port) as node:
            ids[port] = node.execute_command("CLUSTER", "MYID").decode()
    return ids


def _owner(cluster: RedisServer, slot: int) -> int:
    with _node(cluster.port) as node:
        for first, last, master, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return int(master[1])
    raise AssertionError(f"slot {slot} is not covered")


def _move(cluster: RedisServer, ids: dict[int, str], slot: int) -> int:
    """Move ``slot`` to another node step by step, as ``redis-cli --cluster reshard``
    does; returns the new owner.  Synchronous, run in a thread: the calls' event loop
    does not slow the move down."""
    source = _owner(cluster, slot)
    target = next(port for port in cluster.ports if port != source)
    with _node(source) as src, _node(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
    for port in (target, source, *ids):
        with _node(port) as node:
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    return target


async def test_calls_during_a_slot_migration_get_typed_errors_or_succeed(
    redis_cluster: RedisServer,
) -> None:
    # The session's cluster: the slot of this test's hash tag holds no other test's keys
    # (theirs carry no hash tag, and none runs meanwhile); where the slot ends up is of no
    # concern to them, their clients follow MOVED.
    cluster = redis_cluster
    ids = await asyncio.to_thread(_ids, cluster)
    client = cluster.cluster_client()
    store = RedisStore(client, key_prefix=PREFIX)
    manager = Manager(store, Options(key_prefix="reshard"))
    try:
        await store.load_scripts()
        slot = key_slot(PREFIX.encode())
        untyped: list[BaseException] = []
        typed: Counter[str] = Counter()
        returned: list[dict[str, Any]] = []
        answered = 0  # every call that returned, replays included
        moving = True

        async def worker(number: int) -> None:
            nonlocal answered
            call = 0
            while moving:
                call += 1
                payload = {"worker": number, "call": call % PAYLOADS}
                try:
                    await manager.execute(payload, lambda: asyncio.sleep(0, "done"), timeout=10)
                except errors.IdempotencyError as exc:
                    typed[type(exc).__name__] += 1
                except Exception as exc:  # what G5 forbids
                    untyped.append(exc)
                else:
                    answered += 1
                    if call <= PAYLOADS:
                        returned.append(payload)

        workers = [asyncio.create_task(worker(n)) for n in range(WORKERS)]
        try:
            await asyncio.sleep(0.2)
            before = answered
            for move in range(MOVES):
                target = await asyncio.to_thread(_move, cluster, ids, slot)
                owner = await asyncio.to_thread(_owner, cluster, slot)
                assert owner == target, f"move {move} did not land"
                await asyncio.sleep(0.05)  # the clients meet the new owner
            # Replays count: on a fast machine every first call is done before the moves.
            during = answered - before
        finally:
            moving = False
            await asyncio.gather(*workers)

        assert not untyped, f"{len(untyped)} untyped failures, e.g. {untyped[0]!r}"
        assert during > 0  # the calls went on while the slot moved
        # Every first call that returned was recorded: the store, read back, holds it.
        keys = [manager.key_for(payload) or "" for payload in returned]
        verdicts = []
        for start in range(0, len(keys), WORKERS):  # as many at once as the calls were
            chunk = keys[start : start + WORKERS]
            verdicts += await asyncio.gather(*(store.get(key, now=time.time()) for key in chunk))
        for payload, verdict in zip(returned, verdicts, strict=True):
            assert verdict.record is not None, payload
            assert verdict.record.status is Status.COMPLETED, payload
    finally:
        await store.aclose()
        await client.aclose()


class _Defective:
    """A real client whose next ``failures`` script calls fail as redis-py's cluster client
    fails them mid-reload: a bare ``AttributeError`` raised inside the client, before the
    command was sent."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def evalsha(self, *args: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise AttributeError("'NoneType' object has no attribute 'writelines'")
        self.sent += 1
        return await self.inner.evalsha(*args)


async def test_a_client_defect_is_resent_then_typed(redis_server: RedisServer) -> None:
    client = redis_server.client()
    try:
        flaky = _Defective(client, failures=2)
        store = RedisStore(flaky, key_prefix=f"defect{time.monotonic_ns()}:")
        manager = Manager(store, Options(key_prefix="d"))
        await store.load_scripts()
        # Two failures in a row: resent twice, then it lands (one claim, one completion).
        assert await manager.execute({"id": 1}, lambda: asyncio.sleep(0, "ran"), timeout=5) == "ran"
        assert flaky.sent == 2
        # Failing every time: a typed store error, the callback never runs.
        flaky.failures = 10
        ran: list[int] = []

        async def effect() -> str:
            ran.append(1)
            return "ran"

        with pytest.raises(errors.StoreUnavailableError, match="inside the Redis client") as caught:
            await manager.execute({"id": 2}, effect, timeout=5)
        assert isinstance(caught.value.__cause__, AttributeError)
        assert ran == []
        # force_release is not resent: a second run would say nothing was deleted.
        flaky.failures = 1
        with pytest.raises(errors.StoreUnavailableError):
            await store.force_release(manager.key_for({"id": 1}) or "")
        assert flaky.failures == 0
    finally:
        await client.aclose()
