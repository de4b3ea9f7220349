"""The Manager on RedisStore over real redis-server processes: round trips, many processes,
crashes, zombies and skewed clocks (the server's clock judges)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import RedisServer
from support import start_holding

from idempotency_async import LocalCache, Manager, Options, errors
from idempotency_async.record import Status
from idempotency_async.stores.redis import RedisStore

pytestmark = pytest.mark.redis

_WORKER = Path(__file__).with_name("_redis_worker.py")
# Workers import this checkout's package, whatever is installed.
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}


async def _worker(*args: str, **options: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(_WORKER), *args, env=_ENV, **options
    )


async def _reap(processes: list[asyncio.subprocess.Process]) -> None:
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()


class CountingRedis(redis_asyncio.Redis):
    """A real client that also records the name of every command it sends."""

    sent: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return await super().execute_command(*args, **options)


@contextlib.asynccontextmanager
async def counting_store(server: RedisServer) -> AsyncIterator[tuple[RedisStore, list[str]]]:
    client = CountingRedis(host="127.0.0.1", port=server.port)
    client.sent = []
    try:
        await client.ping()
        store = RedisStore(client, key_prefix=f"m{uuid.uuid4().hex[:8]}:")
        await store.load_scripts()
        client.sent.clear()
        yield store, client.sent
    finally:
        await client.aclose()


async def _value() -> dict[str, Any]:
    return {"charged": True, "amount": 12.5, "big": 2**80}


async def test_store_round_trips_per_path(redis_server: RedisServer) -> None:
    async with counting_store(redis_server) as (store, sent):
        first = Manager(store, Options(key_prefix="rt", local_cache=LocalCache()))
        second = Manager(store, Options(key_prefix="rt"))

        await first.execute({"id": 1}, _value, timeout=10)
        assert sent == ["EVALSHA", "EVALSHA"]  # claim + complete
        sent.clear()
        assert await second.execute({"id": 1}, _value, timeout=10) == await _value()
        assert sent == ["EVALSHA"]  # replay: the refused claim returns the record
        sent.clear()
        assert await first.execute({"id": 1}, _value, timeout=10) == await _value()
        assert sent == []  # cached replay

        release = asyncio.Event()
        holder = await start_holding(first, {"id": 2}, until=release, result="slow", timeout=10)
        sent.clear()
        with pytest.raises(errors.AlreadyInProgressError):
            await second.execute({"id": 2}, _value, timeout=10)
        assert sent == ["EVALSHA"]  # in-progress rejection from another process
        release.set()
        assert await holder == "slow"


async def test_four_processes_run_each_shared_key_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    side_effects = tmp_path / "side-effects.log"
    prefix = f"multi{uuid.uuid4().hex[:8]}:"
    processes = [
        await _worker(
            "run",
            str(redis_server.port),
            prefix,
            str(side_effects),
            f"w{n}",
            "50",
            "20",
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(4)
    ]
    try:
        for process in processes:
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
            assert process.returncode == 0, stderr.decode()[-3000:]
    finally:
        await _reap(processes)
    lines = side_effects.read_text().splitlines()
    per_key = Counter(line.split()[0] for line in lines)
    assert per_key == Counter({str(key): 1 for key in range(20)})


async def test_a_killed_holder_blocks_until_its_lease_ends_then_the_key_is_reclaimed(
    redis_server: RedisServer,
) -> None:
    prefix = f"kill{uuid.uuid4().hex[:8]}:"
    lease = 1.5
    process = await _worker(
        "hold", str(redis_server.port), prefix, str(lease), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert line.strip() == b"holding"
        process.send_signal(signal.SIGKILL)
    finally:
        await _reap([process])

    async with redis_server.client() as client:
        manager = Manager(RedisStore(client, key_prefix=prefix), Options(key_prefix="kill"))
        ran = 0

        async def work() -> str:
            nonlocal ran
            ran += 1
            return "second"

        with pytest.raises(errors.AlreadyInProgressError) as refused:
            await manager.execute({"id": "held"}, work, timeout=5)
        assert refused.value.retry_after is not None and 0 < refused.value.retry_after <= lease
        # retry_after counts from when the server judged the claim, which is before its
        # answer arrived (and after the kill, by this client's connect and script load):
        # waiting from the answer is past the lease end, however slow the round trip was.
        await asyncio.sleep(refused.value.retry_after + 0.05)
        assert await manager.execute({"id": "held"}, work, timeout=5) == "second"
        assert ran == 1


async def test_a_killed_holder_with_renewal_frees_its_key_within_one_short_lease(
    redis_server: RedisServer,
) -> None:
    # With renewal on, the key outlives several short leases while the worker lives, and
    # is free within one short lease of its SIGKILL - not at its 60 s deadline.
    prefix = f"kill{uuid.uuid4().hex[:8]}:"
    renew = 1.0
    process = await _worker(
        "hold", str(redis_server.port), prefix, "60", str(renew), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert line.strip() == b"holding"
        async with redis_server.client() as client:
            manager = Manager(RedisStore(client, key_prefix=prefix), Options(key_prefix="kill"))
            ran = 0

            async def work() -> str:
                nonlocal ran
                ran += 1
                return "second"

            await asyncio.sleep(2.5 * renew)  # past two short leases: renewed, still held
            with pytest.raises(errors.AlreadyInProgressError):
                await manager.execute({"id": "held"}, work, timeout=5)
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            await process.wait()
            while True:
                try:
                    result = await manager.execute({"id": "held"}, work, timeout=5)
                    break
                except errors.AlreadyInProgressError:
                    assert time.monotonic() - killed < renew + 0.5, "still blocked"
                    await asyncio.sleep(0.05)
            assert result == "second" and ran == 1
            assert time.monotonic() - killed < renew + 0.5
    finally:
        await _reap([process])


async def test_a_zombie_completion_cannot_touch_the_new_owners_record(
    redis_server: RedisServer,
) -> None:
    async with redis_server.client() as client:
        store = RedisStore(client, key_prefix=f"z{uuid.uuid4().hex[:8]}:")
        await store.load_scripts()  # connected: the 0.3 s call's claim is one round trip
        zombie = Manager(store, Options(key_prefix="z"))
        fresh = Manager(store, Options(key_prefix="z"))
        release_zombie = asyncio.Event()

        zombie_started = asyncio.Event()

        async def stubborn() -> str:
            # Ignores cancellation at its lease end (G1 (a)): a zombie.
            zombie_started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await release_zombie.wait()
            await release_zombie.wait()
            return "zombie"

        zombie_call = asyncio.create_task(zombie.execute({"id": 1}, stubborn, timeout=0.3))
        # The lease (0.3 s) runs from the claim, which the server judged before the callback
        # started: 0.5 s after that start it has ended on the server's clock, however long
        # the claim's round trip (a fresh connection and script load) took.
        await asyncio.wait_for(zombie_started.wait(), timeout=10)
        await asyncio.sleep(0.5)

        async def honest() -> str:
            return "fresh"

        assert await fresh.execute({"id": 1}, honest, timeout=5) == "fresh"
        release_zombie.set()
        with pytest.raises(errors.LeaseLostError) as lost:
            await zombie_call
        assert lost.value.result == "zombie"
        key = fresh.key_for({"id": 1})
        assert key is not None
        record = (await store.get(key, now=0)).record
        assert record is not None and record.status is Status.COMPLETED
        assert record.response == "fresh"


async def test_managers_with_clocks_two_minutes_apart_share_one_lease(
    redis_server: RedisServer,
) -> None:
    async with redis_server.client() as client:
        store = RedisStore(client, key_prefix=f"skew{uuid.uuid4().hex[:8]}:")
        ahead = Manager(store, Options(key_prefix="skew", clock=lambda: time.time() + 120))
        behind = Manager(store, Options(key_prefix="skew", clock=lambda: time.time() - 120))

        release = asyncio.Event()
        holder = await start_holding(behind, {"id": 1}, until=release, result="once", timeout=5)
        # Two minutes ahead, a worker judging by its own clock would see the lease lapsed.
        with pytest.raises(errors.AlreadyInProgressError) as refused:
            await ahead.execute({"id": 1}, _value, timeout=5)
        assert refused.value.retry_after is not None and refused.value.retry_after <= 5.01
        release.set()
        assert await holder == "once"
        assert await ahead.execute({"id": 1}, _value, timeout=5) == "once"
        assert await behind.execute({"id": 1}, _value, timeout=5) == "once"
