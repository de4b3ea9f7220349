"""Redis: the Manager and the store against raw redis-py script calls and powertools.

    python benchmarks/bench_redis.py            # full run (about a minute)
    python benchmarks/bench_redis.py --smoke    # a few seconds, for CI

Everything talks to one redis-server (no persistence) that this script starts as its own
process, so the benchmark process's CPU time (``time.process_time``) is the client's.

First calls (a fresh key each call):
  raw      the store's two scripts (claim, complete) through redis-py ``evalsha``, with
           their arguments prebuilt: the round trips any Redis store has to make
  store    the same two scripts through ``RedisStore.claim`` + ``complete``
  manager  ``Manager.execute(payload, callback, timeout=...)`` on that store
  anchor   aws-lambda-powertools ``idempotent_function`` on its Redis persistence layer
           (redis-py, sync, called sequentially in the main thread)
Replays (one completed key, called again and again):
  raw      the claim script meeting the completed record (it answers with the record)
  manager  ``Manager.execute`` of that key (no local cache)
  anchor   the powertools function called again with the same payload

One round = N sequential calls of one path; the paths' rounds are interleaved (the order
rotates every repeat) and the medians of the per-round means are compared.  Budget: the
manager's client CPU per call at most 25 µs above raw (a loopback round trip costs
~100 µs, so time ratios sit in the noise).  Round trips are counted by the clients'
``execute_command`` in a separate, untimed pass: first call, replay, cached replay,
in-progress rejection.  Last, throughput: 500 concurrent first calls on one event loop
against the anchor on 32 threads.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parent))

import redis
import redis.asyncio as redis_asyncio
from _stats import interleaved, paired, parse_args

from idempotency_async import LocalCache, Manager, MemoryStore, Options
from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion
from idempotency_async.stores._redis_records import claim_tail, completion_tail
from idempotency_async.stores.redis import _CLAIM, _COMPLETE, RedisStore

BUDGET_US = 25.0
TIMEOUT = 10.0
RESPONSE = {"order": 123, "status": "ACCEPTED", "amount": 10.5, "items": ["a", "b"]}


def start_redis() -> tuple[subprocess.Popen[bytes], int, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="bench-redis-")
    process = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process, port, directory
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise SystemExit(
                    "redis-server did not start (apt-get install redis-server)"
                ) from None
            time.sleep(0.02)


class CountingRedis(redis_asyncio.Redis):
    sent: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return await super().execute_command(*args, **options)


class CountingSyncRedis(redis.Redis):
    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


# -- the paths -----------------------------------------------------------------------


def order(order_id: str) -> dict[str, Any]:
    return {"id": order_id, "amount": 10.5, "currency": "EUR"}


async def respond() -> dict[str, Any]:
    return RESPONSE


async def manager_call(manager: Manager, payload: dict[str, Any]) -> None:
    assert await manager.execute(payload, respond, timeout=TIMEOUT) == RESPONSE


class _LambdaContext:
    def get_remaining_time_in_millis(self) -> int:
        return int(TIMEOUT * 1000)


def anchor_function(client: Any) -> Any:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    with warnings.catch_warnings():
        # 3.37 deprecates the class name; CachePersistenceLayer is an alias of it.
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = RedisCachePersistenceLayer(client=client)
    # As in a Lambda handler: the context gives the in-progress record a lease.
    config = IdempotencyConfig(
        expires_after_seconds=3600, lambda_context=cast(Any, _LambdaContext())
    )

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="order", persistence_store=layer, config=config
    )
    def process(order: dict[str, Any]) -> dict[str, Any]:
        return RESPONSE

    return process


@dataclass
class Raw:
    """The store's scripts called straight through redis-py, arguments prebuilt."""

    client: Any
    claim_args: tuple[Any, ...] = ()
    complete_args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        self.claim_args = ("owner", b"", 10.0, 3600.0, claim_tail("owner", "hash"))
        done = Completion("k", "owner", 0.0, 3600.0, "hash", encode_json(RESPONSE), RESPONSE)
        self.complete_args = ("owner", b"", 3600.0, completion_tail(done, done.encoded, None))

    async def first(self, key: str) -> None:
        assert await self.client.evalsha(_CLAIM.sha, 1, key, *self.claim_args) == 1
        assert await self.client.evalsha(_COMPLETE.sha, 1, key, *self.complete_args) == 1

    async def replay(self, key: str) -> None:
        answer = await self.client.evalsha(_CLAIM.sha, 1, key, "other", *self.claim_args[1:])
        assert answer[0] == 3


@dataclass
class Path_:
    name: str
    kind: str
    run: Callable[[int], None]
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def timed_round(self, calls: int) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.run(calls)
        self.walls.append((time.perf_counter() - wall) / calls)
        self.cpus.append((time.process_time() - cpu) / calls)

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)


def fresh() -> str:
    return f"bench#{uuid.uuid4().hex}"


def build_paths(loop: asyncio.AbstractEventLoop, client: Any, sync_client: Any) -> list[Path_]:
    raw = Raw(client)
    store = RedisStore(client)
    manager = Manager(store, Options(key_prefix="bench"))
    process = anchor_function(sync_client)

    def looped(call: Callable[[], Awaitable[None]]) -> Callable[[int], None]:
        async def calls(n: int) -> None:
            for _ in range(n):
                await call()

        return lambda n: loop.run_until_complete(calls(n))

    def repeated(call: Callable[[], object]) -> Callable[[int], None]:
        def calls(n: int) -> None:
            for _ in range(n):
                call()

        return calls

    async def store_first() -> None:
        key, now = fresh(), time.time()
        await store.claim(Claim(key, "owner", now, 10.0, 3600.0, "hash"))
        done = Completion(key, "owner", now, 3600.0, "hash", encode_json(RESPONSE), RESPONSE)
        await store.complete(done)

    loop.run_until_complete(store.load_scripts())
    replay_key = fresh()
    loop.run_until_complete(raw.first(replay_key))
    replay_order = order(uuid.uuid4().hex)
    loop.run_until_complete(manager_call(manager, replay_order))
    anchor_order = order(uuid.uuid4().hex)
    process(order=anchor_order)
    return [
        Path_("raw", "first", looped(lambda: raw.first(fresh()))),
        Path_("store", "first", looped(store_first)),
        Path_("manager", "first", looped(lambda: manager_call(manager, order(uuid.uuid4().hex)))),
        Path_("anchor", "first", repeated(lambda: process(order=order(uuid.uuid4().hex)))),
        Path_("raw", "replay", looped(lambda: raw.replay(replay_key))),
        Path_("manager", "replay", looped(lambda: manager_call(manager, replay_order))),
        Path_("anchor", "replay", repeated(lambda: process(order=anchor_order))),
    ]


# -- round trips and throughput ------------------------------------------------------


def round_trips(loop: asyncio.AbstractEventLoop, port: int) -> dict[str, int]:
    """Commands sent per call: first, replay, cached replay, in-progress rejection."""

    async def count() -> dict[str, int]:
        client = CountingRedis(host="127.0.0.1", port=port)
        client.sent = []
        try:
            store = RedisStore(client)
            await store.load_scripts()
            cached = Manager(store, Options(key_prefix="trips", local_cache=LocalCache()))
            other = Manager(store, Options(key_prefix="trips"))
            payload = order(uuid.uuid4().hex)
            trips = {}
            for name, manager in (("first", cached), ("replay", other), ("cached", cached)):
                client.sent.clear()
                await manager_call(manager, payload)
                trips[name] = len(client.sent)
            started, release = asyncio.Event(), asyncio.Event()

            async def hold() -> dict[str, Any]:
                # Held until the other call was answered: a fixed hold could end first on a
                # slow machine, and the other call would replay instead of being refused.
                started.set()
                await release.wait()
                return RESPONSE

            slow = order(uuid.uuid4().hex)
            holder = asyncio.create_task(cached.execute(slow, hold, timeout=TIMEOUT))
            await started.wait()
            client.sent.clear()
            try:
                await manager_call(other, slow)
            except Exception:  # AlreadyInProgressError
                trips["in progress"] = len(client.sent)
            release.set()
            await holder
            return trips
        finally:
            await client.aclose()

    return loop.run_until_complete(count())


def anchor_round_trips(port: int) -> dict[str, int]:
    client = CountingSyncRedis(host="127.0.0.1", port=port)
    client.sent = []
    try:
        process = anchor_function(client)
        payload = order(uuid.uuid4().hex)
        trips = {}
        for name in ("first", "replay"):
            client.sent.clear()
            process(order=payload)
            trips[name] = len(client.sent)
        return trips
    finally:
        client.close()


def throughput(port: int, calls: int, repeats: int) -> dict[str, float]:
    """First calls per second: 500 calls in flight on one loop, the anchor on 32 threads."""

    async def ours() -> float:
        # redis-py's default pool (100 connections); the store queues calls beyond it.
        client = redis_asyncio.Redis(host="127.0.0.1", port=port)
        try:
            manager = Manager(RedisStore(client), Options(key_prefix="tp"))
            payloads = [order(uuid.uuid4().hex) for _ in range(calls + 500)]

            async def worker() -> None:
                while payloads:
                    await manager_call(manager, payloads.pop())

            warm = [
                asyncio.ensure_future(manager_call(manager, payloads.pop())) for _ in range(500)
            ]
            await asyncio.gather(*warm)
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(500)))
            return calls / (time.perf_counter() - start)
        finally:
            await client.aclose()

    def anchor() -> float:
        client = redis.Redis(host="127.0.0.1", port=port, max_connections=32)
        process = anchor_function(client)
        payloads = [order(uuid.uuid4().hex) for _ in range(calls + 32)]
        with ThreadPoolExecutor(32) as threads:
            list(threads.map(lambda p: process(order=p), payloads[:32]))  # warm up
            start = time.perf_counter()
            list(threads.map(lambda p: process(order=p), payloads[32:]))
            elapsed = time.perf_counter() - start
        client.close()
        return calls / elapsed

    runs = {"ours": lambda: asyncio.run(ours()), "anchor": anchor}
    return interleaved(runs, repeats)


def interleaving(port: int, calls: int, repeats: int) -> dict[str, float]:
    """Client CPU µs per call of a manager call on MemoryStore, of two PINGs, and of both
    in sequence: what running any code between redis-py round trips costs."""

    async def measure() -> dict[str, float]:
        client = redis_asyncio.Redis(host="127.0.0.1", port=port)
        manager = Manager(MemoryStore(max_records=10**7), Options(key_prefix="mem"))

        async def memory() -> None:
            await manager_call(manager, order(uuid.uuid4().hex))

        async def pings() -> None:
            await client.ping()
            await client.ping()

        async def both() -> None:
            await memory()
            await pings()

        samples: dict[str, list[float]] = {"memory": [], "pings": [], "both": []}
        try:
            for _ in range(repeats):
                for name, call in (("memory", memory), ("pings", pings), ("both", both)):
                    start = time.process_time()
                    for _ in range(calls):
                        await call()
                    samples[name].append((time.process_time() - start) / calls * 1e6)
        finally:
            await client.aclose()
        return {name: statistics.median(values) for name, values in samples.items()}

    return asyncio.run(measure())


# -- report --------------------------------------------------------------------------


def measure(port: int, calls: int, repeats: int) -> list[Path_]:
    loop = asyncio.new_event_loop()
    client = redis_asyncio.Redis(host="127.0.0.1", port=port)
    sync_client = redis.Redis(host="127.0.0.1", port=port)
    try:
        paths = build_paths(loop, client, sync_client)
        for path in paths:  # warm up connections and code paths
            path.run(10)
        for repeat in range(repeats):
            shift = repeat % len(paths)
            for path in paths[shift:] + paths[:shift]:
                path.timed_round(calls)
        return paths
    finally:
        sync_client.close()
        loop.run_until_complete(client.aclose())
        loop.close()


def report(paths: list[Path_], calls: int, repeats: int) -> bool:
    by = {(p.name, p.kind): p for p in paths}
    print(
        f"Redis on loopback (redis-server, no persistence): {calls} sequential calls per round, "
        f"{repeats} interleaved rounds per path"
    )
    print(
        f"  {'path':<15}{'µs/call':>9}{'client CPU':>12}\n  {'':<15}{'(median)':>9}{'µs/call':>12}"
    )
    for p in paths:
        print(f"  {p.kind + ' ' + p.name:<15}{p.wall * 1e6:9.0f}{p.cpu * 1e6:12.0f}")
    within = True
    for kind in ("first", "replay"):
        raw, manager, anchor = by[("raw", kind)], by[("manager", kind)], by[("anchor", kind)]
        above = (manager.cpu - raw.cpu) * 1e6
        ok = above <= BUDGET_US
        within &= ok
        store = (
            f", store {(by[('store', kind)].cpu - raw.cpu) * 1e6:.0f}" if kind == "first" else ""
        )
        print(
            f"  {kind:<7}time manager/raw {manager.wall / raw.wall:.3f}, "
            f"anchor/manager {anchor.wall / manager.wall:.2f}; client CPU above raw: "
            f"manager {above:.0f} µs{store} ({'within' if ok else 'OVER'} the {BUDGET_US:.0f} µs "
            f"budget); anchor/manager CPU {anchor.cpu / manager.cpu:.2f}"
        )
        print(
            f"  {'':<7}within rounds, median (range): time manager/raw "
            f"{paired(manager.walls, raw.walls)}, anchor/manager "
            f"{paired(anchor.walls, manager.walls)}; CPU manager/raw "
            f"{paired(manager.cpus, raw.cpus)}, anchor/manager "
            f"{paired(anchor.cpus, manager.cpus)}"
        )
    return within


def main() -> None:
    args = parse_args(__doc__ or "")
    calls, repeats = (20, 3) if args.smoke else (100, 25)
    repeats = args.repeats or repeats
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    logging.getLogger("aws_lambda_powertools").setLevel(logging.ERROR)
    process, port, directory = start_redis()
    try:
        paths = measure(port, calls, repeats)
        within = report(paths, calls, repeats)
        loop = asyncio.new_event_loop()
        try:
            trips = round_trips(loop, port)
            anchor_trips = anchor_round_trips(port)
        finally:
            loop.close()
        rates = throughput(port, 1000 if args.smoke else 5000, 1 if args.smoke else 5)
        mixed = interleaving(port, 200 if args.smoke else 1000, 3 if args.smoke else 9)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)
    print("  round trips per call: " + ", ".join(f"{k} {v}" for k, v in trips.items()))
    print("  anchor round trips: " + ", ".join(f"{k} {v}" for k, v in anchor_trips.items()))
    print(
        f"  throughput, first calls (medians): {rates['ours']:.0f}/s with 500 calls in flight "
        f"on one loop vs anchor {rates['anchor']:.0f}/s on 32 threads "
        f"({rates['ours'] / rates['anchor']:.2f}x)"
    )
    print(
        f"  client CPU µs/call: manager on MemoryStore {mixed['memory']:.1f}, two PINGs "
        f"{mixed['pings']:.1f}, the two in sequence {mixed['both']:.1f} "
        f"(+{mixed['both'] - mixed['memory'] - mixed['pings']:.1f} from interleaving)"
    )
    if trips != {"first": 2, "replay": 1, "cached": 0, "in progress": 1}:
        raise SystemExit(f"round trips are not 2/1/0/1: {trips}")
    if not within:
        if args.smoke:
            print("  (over budget: smoke runs are too short to judge; not failing)")
        else:
            raise SystemExit("over budget")


if __name__ == "__main__":
    main()
