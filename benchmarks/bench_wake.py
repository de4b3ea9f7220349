"""Waiters woken by Redis pub/sub against waiters polling: how soon a duplicate waiting in
another process replays after the holder's callback returns, and how many store requests
its wait costs; plus what publishing costs the writer.

Each wait: a holder (its own store, client and manager) claims a fresh key and holds it
for a random time (uniform, 0.05 to 1.5 s, so the poll schedule is not in phase); a waiter
(another store, client and manager, as another process has) calls ``execute`` on the same
payload with ``Options(wait=Wait())`` and replays.  Latency is from the holder's callback
returning (its completion write is still to be sent) to the waiter's ``execute``
returning.  Requests are the waiter's store commands, its claim included.  Modes run in
interleaved rounds (order rotated), 20 waits at a time.

    python benchmarks/bench_wake.py [--rounds 10] [--port PORT]
    python benchmarks/bench_wake.py --smoke   # CI: one round, fails if a waiter got no replay

Without ``--port`` it starts a redis-server of its own (``--save '' --appendonly no``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import redis.asyncio as redis_asyncio

from idempotency_async import Manager, Options, Wait
from idempotency_async.stores.redis import RedisStore

_CONCURRENT = 20


class _Counting(redis_asyncio.Redis):
    sent = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        _Counting.sent += 1
        return await super().execute_command(*args, **options)


async def _one_wait(holder: Manager, waiter: Manager, hold: float, latencies: list[float]) -> None:
    payload = {"id": uuid.uuid4().hex}
    release = asyncio.Event()
    running = asyncio.Event()
    returned: list[float] = []

    async def work() -> str:
        running.set()
        await release.wait()
        returned.append(time.perf_counter())
        return "done"

    async def duplicate() -> str:
        raise AssertionError("the waiter ran the callback")

    holding = asyncio.create_task(holder.execute(payload, work, timeout=30))
    await running.wait()
    waiting = asyncio.create_task(waiter.execute(payload, duplicate, timeout=30))
    await asyncio.sleep(hold)
    release.set()
    await holding
    assert await waiting == "done"
    latencies.append(time.perf_counter() - returned[0])


async def _chunk(url: str, wake: bool, rng: random.Random) -> tuple[list[float], float]:
    prefix = f"bench-wake-{uuid.uuid4().hex[:6]}:"
    options = Options(event_key_jmespath="id", wait=Wait(timeout=20.0))
    holder_client = redis_asyncio.Redis.from_url(url)
    waiter_client = _Counting.from_url(url)
    holder_store = RedisStore(holder_client, key_prefix=prefix)
    waiter_store = RedisStore(waiter_client, key_prefix=prefix, wake_waiters=wake)
    await holder_store.load_scripts()
    await waiter_store.load_scripts()
    latencies: list[float] = []
    try:
        holder, waiter = Manager(holder_store, options), Manager(waiter_store, options)
        _Counting.sent = 0
        holds = [rng.uniform(0.05, 1.5) for _ in range(_CONCURRENT)]
        await asyncio.gather(*(_one_wait(holder, waiter, h, latencies) for h in holds))
        requests = _Counting.sent / _CONCURRENT
    finally:
        await holder_store.aclose()
        await waiter_store.aclose()
        await holder_client.aclose()
        await waiter_client.aclose()
    return latencies, requests


async def _writer_cost(url: str, chunks: int = 20, calls: int = 100) -> str:
    """Per first call (claim + complete), µs, with and without the PUBLISH in the script:
    chunks of ``calls`` calls, the two alternating (order rotated); the ratio is taken
    within each pair of chunks."""
    client = redis_asyncio.Redis.from_url(url)
    costs: dict[str, list[float]] = {"publish": [], "no publish": []}
    ratios: list[float] = []
    try:
        for chunk in range(chunks):
            order = ("publish", "no publish") if chunk % 2 == 0 else ("no publish", "publish")
            for name in order:
                store = RedisStore(client, key_prefix=f"bench-wake-w{uuid.uuid4().hex[:6]}:")
                if name == "no publish":
                    store._publish = b""  # what the store sends on a cluster
                manager = Manager(store, Options(event_key_jmespath="id"))
                started = time.perf_counter()
                for index in range(calls):
                    await manager.execute({"id": index}, _answer, timeout=10)
                costs[name].append((time.perf_counter() - started) / calls * 1e6)
            ratios.append(costs["publish"][-1] / costs["no publish"][-1])
    finally:
        await client.aclose()
    medians = ", ".join(f"{name} {statistics.median(v):.0f} µs" for name, v in costs.items())
    return (
        f"{medians}; publish / no publish within pairs {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )


async def _answer() -> int:
    return 1


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _main(url: str, rounds: int, smoke: bool = False) -> None:
    rng = random.Random(7)
    results: dict[str, tuple[list[float], list[float]]] = {
        "pub/sub": ([], []),
        "polling": ([], []),
    }
    for index in range(rounds):
        order = ["pub/sub", "polling"] if index % 2 == 0 else ["polling", "pub/sub"]
        for mode in order:
            latencies, requests = await _chunk(url, mode == "pub/sub", rng)
            results[mode][0].extend(latencies)
            results[mode][1].append(requests)
    print(
        f"{'mode':<9} {'waits':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'requests/wait':>14}"
    )
    for mode, (latencies, requests) in results.items():
        print(
            f"{mode:<9} {len(latencies):>5} {_percentile(latencies, 0.5) * 1e3:>8.1f} "
            f"{_percentile(latencies, 0.99) * 1e3:>8.1f} {max(latencies) * 1e3:>8.1f} "
            f"{statistics.mean(requests):>14.2f}"
        )
    if smoke:
        # Every wait ended in a replay (a waiter that got no replay raised out of _chunk);
        # a woken waiter must not be slower than polling's schedule allows.
        woken = _percentile(results["pub/sub"][0], 0.5)
        if woken > 1.0:
            sys.exit(f"smoke: waiters woken by pub/sub replayed after {woken:.2f} s (p50)")
        print("  " + await _writer_cost(url, chunks=2, calls=20))
        return
    print("writer, first call (claim + complete), median of 20 chunks of 100:")
    print("  " + await _writer_cost(url))


def _start_server() -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install -y redis-server)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    directory = tempfile.mkdtemp(prefix="bench-wake-")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.connect(("127.0.0.1", port))
            return process, port
        time.sleep(0.05)
    process.kill()
    sys.exit("redis-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--port", type=int)
    parser.add_argument("--smoke", action="store_true", help="one round, a few seconds (CI)")
    arguments = parser.parse_args()
    rounds = 1 if arguments.smoke else arguments.rounds
    process = None
    port = arguments.port
    if port is None:
        process, port = _start_server()
    try:
        asyncio.run(_main(f"redis://127.0.0.1:{port}", rounds, arguments.smoke))
    finally:
        if process is not None:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
