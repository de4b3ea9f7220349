"""Duplicates waiting on a key in progress in a Redis store are woken by pub/sub: the
completion and release scripts publish, each store holds one subscription, fanned out to
its waiters; polling stays underneath.  Against a real redis-server of this module's own
(the tests kill pub/sub connections)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import RedisServer, start_redis, stop_redis
from support import start_holding

from idempotency_async import Manager, Options, Wait
from idempotency_async.errors import AlreadyInProgressError
from idempotency_async.stores.base import Wakes
from idempotency_async.stores.redis import RedisStore

pytestmark = pytest.mark.redis

_TASK = "idempotency-async redis wake-ups"
_WORKER = Path(__file__).with_name("_redis_worker.py")
# The worker imports this checkout's package, whatever is installed.
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}
# Waiting this long makes the next poll of a waiter that is not woken at least ~1.5 s
# away (its polls back off: 0.05, 0.1, 0.2, 0.4, 0.8, … s), so "woken" is told apart.
_SETTLE = 1.7
_WOKEN = 0.5


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        stop_redis(server)


@contextlib.asynccontextmanager
async def _store(server: RedisServer, prefix: str, **options: Any) -> AsyncIterator[RedisStore]:
    """A store on its own client: as another process would have."""
    client = server.client()
    store = RedisStore(client, key_prefix=prefix, **options)
    try:
        await store.load_scripts()
        yield store
    finally:
        await store.aclose()
        await client.aclose()


def _options() -> Options:
    return Options(event_key_jmespath="id", wait=Wait(timeout=15.0))


async def _subscribers(server: RedisServer, channel: str) -> int:
    async with server.client() as client:
        answer = await client.pubsub_numsub(channel)
    return int(answer[0][1])


async def _until(condition: Any, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def _wake_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == _TASK]


async def test_redis_store_offers_wakeups_and_cluster_stores_do_not(server: RedisServer) -> None:
    async with _store(server, "p:") as store:
        assert isinstance(store, Wakes) and store.wake_waiters
    async with _store(server, "p:", wake_waiters=False) as store:
        assert not store.wake_waiters
    # (No connection is made: the cluster client connects on first use.)
    cluster = server.cluster_client()
    assert not RedisStore(cluster).wake_waiters
    await cluster.aclose()
    one = server.client(max_connections=1)
    assert not RedisStore(one).wake_waiters  # the pub/sub connection would starve calls
    await one.aclose()


async def test_valkey_client_waiters_are_woken(server: RedisServer) -> None:
    valkey_asyncio = pytest.importorskip("valkey.asyncio")
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    holder_client = valkey_asyncio.Valkey(host="127.0.0.1", port=server.port)
    waiter_client = valkey_asyncio.Valkey(host="127.0.0.1", port=server.port)
    holder_store = RedisStore(holder_client, key_prefix=prefix)
    waiter_store = RedisStore(waiter_client, key_prefix=prefix)
    try:
        holder, waiter = Manager(holder_store, _options()), Manager(waiter_store, _options())
        payload = {"id": "order-v"}
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result="done")
        waiting = asyncio.create_task(waiter.execute(payload, _never, timeout=30))
        await _until(lambda: _listening(waiter_store))
        await asyncio.sleep(_SETTLE)
        release.set()
        await holding
        completed = time.monotonic()
        assert await waiting == "done"
        assert time.monotonic() - completed < _WOKEN
    finally:
        await holder_store.aclose()
        await waiter_store.aclose()
        await holder_client.aclose()
        await waiter_client.aclose()


async def test_waiter_in_another_manager_is_woken_after_completion(server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as waiter_store:
        holder, waiter = Manager(holder_store, _options()), Manager(waiter_store, _options())
        payload = {"id": "order-1"}
        channel = prefix + str(holder.key_for(payload))
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result="done", timeout=30)
        waiting = asyncio.create_task(waiter.execute(payload, _never, timeout=30))
        await _until(lambda: _listening(waiter_store))
        await asyncio.sleep(_SETTLE)
        release.set()
        assert await holding == "done"
        completed = time.monotonic()
        assert await waiting == "done"
        assert time.monotonic() - completed < _WOKEN
        await _until(lambda: _no_subscriber(server, channel))


async def test_waiter_in_another_manager_is_woken_after_release(server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as waiter_store:
        holder, waiter = Manager(holder_store, _options()), Manager(waiter_store, _options())
        payload = {"id": "order-2"}
        release = asyncio.Event()
        holding = await start_holding(
            holder, payload, until=release, error=ValueError("card declined"), timeout=30
        )
        ran_at: list[float] = []

        async def second_try() -> str:
            ran_at.append(time.monotonic())
            return "charged"

        waiting = asyncio.create_task(waiter.execute(payload, second_try, timeout=30))
        await _until(lambda: _listening(waiter_store))
        await asyncio.sleep(_SETTLE)
        release.set()
        with pytest.raises(ValueError, match="card declined"):
            await holding
        released = time.monotonic()
        assert await waiting == "charged"
        assert ran_at[0] - released < _WOKEN


async def test_waiter_in_another_process_is_woken_after_completion(server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    options = Options(key_prefix="wake", event_key_jmespath="id", wait=Wait(timeout=30))
    async with _store(server, prefix) as holder_store:
        holder = Manager(holder_store, options)
        payload = {"id": "waited"}
        channel = prefix + str(holder.key_for(payload))
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result="done", timeout=30)
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(_WORKER),
            "wait",
            str(server.port),
            prefix,
            env=_ENV,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            await _until(lambda: _has_subscriber(server, channel), seconds=20)
            await asyncio.sleep(_SETTLE)
            release.set()
            assert await holding == "done"
            completed = time.time()
            output, _ = await asyncio.wait_for(worker.communicate(), 20)
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
        result, replayed_at = output.decode().split()
        assert result == "done"
        assert float(replayed_at) - completed < _WOKEN
        assert worker.returncode == 0


async def test_one_subscription_per_store_wakes_every_waiter(server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as waiter_store:
        holder = Manager(holder_store, _options())
        # Managers of their own (one process each would do the same): no in-process joining.
        waiters = [Manager(waiter_store, _options()) for _ in range(20)]
        payload = {"id": "order-3"}
        channel = prefix + str(holder.key_for(payload))
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result=7, timeout=30)
        waiting = [asyncio.create_task(m.execute(payload, _never, timeout=30)) for m in waiters]
        await _until(lambda: _listening(waiter_store))
        assert await _subscribers(server, channel) == 1
        await asyncio.sleep(_SETTLE)
        release.set()
        await holding
        completed = time.monotonic()
        assert await asyncio.gather(*waiting) == [7] * 20
        assert time.monotonic() - completed < _WOKEN


async def test_cancelled_waiters_leave_no_subscription(server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as waiter_store:
        holder = Manager(holder_store, _options())
        payload = {"id": "order-4"}
        channel = prefix + str(holder.key_for(payload))
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result=1, timeout=30)
        waiting = [
            asyncio.create_task(Manager(waiter_store, _options()).execute(payload, _never))
            for _ in range(3)
        ]
        await _until(lambda: _listening(waiter_store))
        for task in waiting:
            task.cancel()
        for task in waiting:
            with pytest.raises(asyncio.CancelledError):
                await task
        await _until(lambda: _no_subscriber(server, channel))
        assert len(_wake_tasks()) == 1  # the store's task stays for the next waiter
        release.set()
        await holding


async def test_lost_subscription_falls_back_to_polling_and_reconnects(
    server: RedisServer,
) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as waiter_store:
        holder, waiter = Manager(holder_store, _options()), Manager(waiter_store, _options())
        for attempt in range(2):
            payload = {"id": f"order-5-{attempt}"}
            release = asyncio.Event()
            holding = await start_holding(holder, payload, until=release, result=attempt)
            waiting = asyncio.create_task(waiter.execute(payload, _never, timeout=30))
            await _until(lambda: _listening(waiter_store))
            if attempt == 0:
                # The subscription is lost, and the completion lands while it is: the waiter
                # still replays (woken by the loss or by the next poll).
                assert server.cli("CLIENT", "KILL", "TYPE", "pubsub").strip() != "0"
                release.set()
                assert await holding == 0
                assert await waiting == 0
            else:
                # ... and the store subscribed again: the next waiter is woken.
                await asyncio.sleep(_SETTLE)
                release.set()
                await holding
                completed = time.monotonic()
                assert await waiting == 1
                assert time.monotonic() - completed < _WOKEN
        assert _pubsub_connections(server) == 1


async def test_store_close_stops_the_task_and_closes_the_connection(
    server: RedisServer,
) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    before = _pubsub_connections(server)
    async with _store(server, prefix) as holder_store:
        holder = Manager(holder_store, _options())
        for owned in (False, True):
            client = server.client()
            store = (
                RedisStore.from_url(server.url, key_prefix=prefix)
                if owned
                else RedisStore(client, key_prefix=prefix)
            )
            payload = {"id": f"order-6-{owned}"}
            release = asyncio.Event()
            holding = await start_holding(holder, payload, until=release, result=1)
            waiting = asyncio.create_task(
                Manager(store, _options()).execute(payload, _never, timeout=30)
            )
            await _until(lambda s=store: _listening(s))  # type: ignore[misc]
            assert _pubsub_connections(server) == before + 1
            release.set()
            await holding
            assert await waiting == 1
            await store.aclose()
            assert _wake_tasks() == []
            assert _pubsub_connections(server) == before
            await client.aclose()


async def test_a_refused_publish_never_fails_the_write_and_waiters_poll(
    server: RedisServer,
) -> None:
    """Redis 7 ACL users get no channel permissions by default: the completion still
    writes, the waiter's SUBSCRIBE is refused, and it polls."""
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    server.cli("ACL", "SETUSER", user, "on", f">{password}", "~*", "+@all", "resetchannels")
    prefix = f"w{uuid.uuid4().hex[:8]}:"
    client = redis_asyncio.Redis(
        host="127.0.0.1", port=server.port, username=user, password=password
    )
    try:
        holder_store = RedisStore(client, key_prefix=prefix)
        waiter_store = RedisStore(client, key_prefix=prefix)
        holder, waiter = Manager(holder_store, _options()), Manager(waiter_store, _options())
        payload = {"id": "order-7"}
        release = asyncio.Event()
        holding = await start_holding(holder, payload, until=release, result="kept")
        waiting = asyncio.create_task(waiter.execute(payload, _never, timeout=30))
        await asyncio.sleep(0.3)
        assert not waiter_store._wakeups.live  # type: ignore[union-attr]
        release.set()
        assert await holding == "kept"
        assert await waiting == "kept"
        await holder_store.aclose()
        await waiter_store.aclose()
    finally:
        await client.aclose()
        server.cli("ACL", "DELUSER", user)


async def _never() -> Any:
    raise AssertionError("a waiter ran the callback while the holder held the key")


async def _listening(store: RedisStore) -> bool:
    wakeups = store._wakeups
    return wakeups is not None and bool(wakeups.live)


async def _has_subscriber(server: RedisServer, channel: str) -> bool:
    return await _subscribers(server, channel) > 0


async def _no_subscriber(server: RedisServer, channel: str) -> bool:
    return await _subscribers(server, channel) == 0


def _pubsub_connections(server: RedisServer) -> int:
    listed = server.cli("CLIENT", "LIST", "TYPE", "pubsub")
    return len([line for line in listed.splitlines() if line.strip()])


async def test_a_duplicate_refused_at_once_subscribes_to_nothing(server: RedisServer) -> None:
    # Waiting off (the default): an in-progress duplicate is refused without opening the
    # store's pub/sub connection or starting its task (each refusal once did both).
    prefix = f"r{uuid.uuid4().hex[:8]}:"
    async with _store(server, prefix) as holder_store, _store(server, prefix) as store:
        holder = Manager(holder_store, _options())
        release = asyncio.Event()
        payload = {"id": "order-r"}
        holding = await start_holding(holder, payload, until=release)
        refusing = Manager(store, Options(event_key_jmespath="id"))
        for _ in range(3):
            with pytest.raises(AlreadyInProgressError):
                await refusing.execute(payload, _never)
        assert _wake_tasks() == []
        assert not await _subscribed(server)
        # The same duplicate that waits does subscribe (what the check above would see).
        waiting = asyncio.create_task(Manager(store, _options()).execute(payload, _never))
        await _until(lambda: _subscribed(server))
        release.set()
        assert await waiting == await holding


async def _never() -> Any:
    raise AssertionError("a duplicate ran the callback")


async def _subscribed(server: RedisServer) -> bool:
    async with server.client() as client:
        channels = await client.pubsub_channels()
    return bool(channels)
