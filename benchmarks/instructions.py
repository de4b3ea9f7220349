"""Instructions per call, counted by valgrind: a measure the machine's load does not move.

    python benchmarks/instructions.py                # this checkout: first call and replay
    python benchmarks/instructions.py --rev 7116c7c  # an earlier commit's package
    python benchmarks/instructions.py --frames       # Python frames per call (cProfile)
    python benchmarks/instructions.py --store redis  # RedisStore's own work per call
    python benchmarks/instructions.py --store redis-server   # manager / raw on Redis

On a shared machine a CPU-time ratio strays by ±20 % from one round to the next, more than
most single optimisations of the call path are worth.  The number of instructions the
interpreter executes for a call is deterministic to about 0.1 % (hash seed fixed), so a
change of 1 % shows.  It is a proxy, not a time: a cache miss costs more than an
instruction, and the per-call figures in BENCHMARKS.md remain CPU time.

Each measurement runs the interpreter under ``valgrind --tool=callgrind`` twice, with
1,000 and 3,000 calls after a warm-up, and divides the difference by 2,000: start-up and
imports cancel out.  The calls are ``bench_manager.py``'s: ``Manager(MemoryStore(),
Options()).execute(order, lambda: process(order), timeout=10)``, a fresh payload per call
(a replay: a fresh copy of one order).  Needs valgrind; about a minute per figure.
``--store redis`` counts ``RedisStore``'s own work instead: ``claim`` + ``complete`` of a
fresh key (first call), ``claim`` meeting a completed record (replay), on a client that
answers every script at once as redis-server would (its pool sized as redis-py's default,
so the store's queue is on); no manager, no I/O.  ``--store redis-server`` counts whole calls
against a redis-server this script starts (the client process only; 300 and 900 calls):
``bench_redis.py``'s raw script calls and its manager, first call and replay, and their
ratio — the I/O makes these counts steady to a few per cent (the loop turns vary), not 0.1 %.
It also counts the same manager calls on a store that costs nothing (its answers, learnt
from ``MemoryStore`` on the first call, returned as they are), added to raw: the floor of
manager / raw for any store, the manager's own work alone.
``--frames`` counts Python frames per call instead (cProfile's call counts, no valgrind):
all of them, and the library's own.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

WARM_UP = 200
FEW, MANY = 1_000, 3_000
SERVER_FEW, SERVER_MANY = 300, 900  # calls against redis-server: ~0.8 M instructions each


def order(n: int) -> dict[str, Any]:
    return {"id": f"ord-{n}", "amount": 10 + n % 90, "currency": "EUR", "customer": f"c-{n % 977}"}


async def process(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["id"], "status": "charged"}


async def calls(kind: str, count: int) -> None:
    """The child's work: ``count`` calls of ``kind`` after the warm-up."""
    if kind.startswith("redis-"):
        await redis_calls(kind.removeprefix("redis-"), count)
        return
    if kind.startswith("server-"):
        await server_calls(kind.removeprefix("server-"), count)
        return
    from idempotency_async import Manager, MemoryStore, Options

    manager = Manager(MemoryStore(), Options())
    for n in range(WARM_UP):
        await manager.execute(order(10**6 + n), lambda: process(order(0)), timeout=10)
    await manager.execute(order(0), lambda: process(order(0)), timeout=10)
    if kind == "first":
        payloads = [order(n) for n in range(1, count + 1)]
    else:
        payloads = [order(0) for _ in range(count)]
    for payload in payloads:
        await manager.execute(payload, lambda payload=payload: process(payload), timeout=10)


async def redis_calls(kind: str, count: int) -> None:
    """``RedisStore`` on a client answering each script at once (see the module's doc)."""
    from idempotency_async._json import encode_json
    from idempotency_async.record import Claim, Completion
    from idempotency_async.stores._redis_records import completion_tail
    from idempotency_async.stores.redis import RedisStore

    response = {"order": "ord-0", "status": "charged"}
    done = Completion("k", "owner", 0.0, 3600.0, "hash", encode_json(response), response)
    record = b'{"status":"COMPLETED","expiration":4102444800'
    record += completion_tail(done, done.encoded, None)

    class ConnectionPool:  # named and sized as redis-py's default pool
        max_connections = 100

    class Client:
        connection_pool = ConnectionPool()

        async def evalsha(self, sha: str, numkeys: int, key: str, *args: Any) -> Any:
            return [3, record, b"1700000000.000000", key.encode()] if kind == "replay" else 1

        async def script_load(self, text: str) -> None:
            return None

    store = RedisStore(Client())
    await store.load_scripts()

    async def call(n: int) -> None:
        key = "k" if kind == "replay" else f"k{n}"
        await store.claim(Claim(key, "owner", 1.7e9, 10.0, 3600.0, "hash"))
        if kind == "first":
            await store.complete(done._replace(key=key))

    for n in range(WARM_UP):
        await call(-n)
    for n in range(count):
        await call(n)


async def server_calls(kind: str, count: int) -> None:
    """``bench_redis.py``'s paths against the redis-server on port ``$BENCH_REDIS_PORT``:
    ``kind`` is ``raw-first``, ``raw-replay``, ``manager-first`` or ``manager-replay``; or
    ``free-first`` and ``free-replay``, the manager's calls on a store that costs nothing."""
    import uuid

    import redis.asyncio as redis_asyncio
    from bench_redis import Raw, fresh, manager_call
    from bench_redis import order as bench_order

    from idempotency_async import Manager, Options
    from idempotency_async.stores.redis import RedisStore

    client = redis_asyncio.Redis(host="127.0.0.1", port=int(os.environ["BENCH_REDIS_PORT"]))
    raw = Raw(client)
    store = RedisStore(client)
    manager = Manager(store, Options(key_prefix="bench"))
    await store.load_scripts()
    replay_key, replay_order = fresh(), bench_order(uuid.uuid4().hex)
    await raw.first(replay_key)
    await manager_call(manager, replay_order)
    free = _free_store()
    free_manager = Manager(free, Options(key_prefix="bench"))
    await manager_call(free_manager, replay_order)  # claimed and completed in earnest
    if kind == "free-replay":
        free.verdict = None  # the next claim meets the completed record, and keeps it
    paths = {
        "raw-first": lambda: raw.first(fresh()),
        "raw-replay": lambda: raw.replay(replay_key),
        "manager-first": lambda: manager_call(manager, bench_order(uuid.uuid4().hex)),
        "manager-replay": lambda: manager_call(manager, replay_order),
        "free-first": lambda: manager_call(free_manager, bench_order(uuid.uuid4().hex)),
        "free-replay": lambda: manager_call(free_manager, replay_order),
    }
    path = paths[kind]
    try:
        for _ in range(WARM_UP):
            await path()
        for _ in range(count):
            await path()
    finally:
        await client.aclose()


def server_figures(root: Path) -> None:
    """Whole calls against a redis-server of our own: raw, manager, and their ratio."""
    from bench_redis import start_redis

    process, port, directory = start_redis()
    os.environ["BENCH_REDIS_PORT"] = str(port)
    try:
        for kind, name in (("first", "first call"), ("replay", "replay")):
            per_call = {}
            for path in ("raw", "manager", "free"):
                child = f"server-{path}-{kind}"
                few, many = counted(root, child, SERVER_FEW), counted(root, child, SERVER_MANY)
                per_call[path] = (many - few) / (SERVER_MANY - SERVER_FEW)
            raw, manager, free = per_call["raw"], per_call["manager"], per_call["free"]
            print(
                f"  {name:<11}raw {raw:>10,.0f}, manager {manager:>10,.0f} instructions "
                f"(manager / raw {manager / raw:.3f}); on a store costing nothing "
                f"{free:>8,.0f} (floor (raw + it) / raw {(raw + free) / raw:.3f})"
            )
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def _free_store() -> Any:
    from idempotency_async import MemoryStore

    class FreeStore(MemoryStore):
        """Answers as ``MemoryStore`` answered the first time, at no cost after."""

        verdict: Any = None
        written: Any = None

        async def claim(self, claim: Any) -> Any:
            if self.verdict is None:
                self.verdict = await super().claim(claim)
            return self.verdict

        async def complete(self, completion: Any) -> Any:
            if self.written is None:
                self.written = await super().complete(completion)
            return self.written

    return FreeStore()


def frames(kind: str) -> tuple[float, float]:
    """The child's work for ``--frames``: Python frames per call (all, the library's own),
    cProfile's call counts over ``MANY`` calls less those over ``FEW``."""
    import cProfile
    import pstats

    def profiled(count: int) -> tuple[int, int]:
        profile = cProfile.Profile()
        profile.enable()
        asyncio.run(calls(kind, count))
        profile.disable()
        counts = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        python = {where: numbers[1] for where, numbers in counts.items() if where[0] != "~"}
        own = sum(n for where, n in python.items() if "idempotency_async" in where[0])
        return sum(python.values()), own

    asyncio.run(calls(kind, 0))  # imports and first shapes, outside the counts
    few, many = profiled(FEW), profiled(MANY)
    return tuple((b - a) / (MANY - FEW) for a, b in zip(few, many, strict=True))  # type: ignore[return-value]


def counted(root: Path, kind: str, count: int) -> int:
    """Instructions the interpreter executed for the child run."""
    environment = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, __file__, "--child", kind, str(count)]
    output = subprocess.run(
        command, env=environment, capture_output=True, text=True, check=True
    ).stderr
    found = re.search(r"Collected : (\d+)", output)
    if found is None:
        raise RuntimeError(f"valgrind printed no count:\n{output[-2000:]}")
    return int(found.group(1))


def exported(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", rev, "idempotency_async"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="measure this commit's package instead (git rev)")
    parser.add_argument("--frames", action="store_true", help="count Python frames instead")
    parser.add_argument(
        "--store",
        choices=("memory", "redis", "redis-server"),
        default="memory",
        help="memory: Manager on MemoryStore (default); redis: RedisStore's own work; "
        "redis-server: whole calls against redis-server, manager and raw",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, count = args.child
        if count == "frames":
            print(*frames(kind))
        else:
            asyncio.run(calls(kind, int(count)))
        return
    with tempfile.TemporaryDirectory() as folder:
        root = Path(__file__).resolve().parent.parent
        if args.rev:
            root = exported(args.rev, Path(folder))
        print(f"package: {args.rev or 'this checkout'} ({root}), store: {args.store}")
        if args.store == "redis-server":
            server_figures(root)
            return
        prefix = "redis-" if args.store == "redis" else ""
        for kind, name in ((prefix + "first", "first call"), (prefix + "replay", "replay")):
            if args.frames:
                environment = {**os.environ, "PYTHONPATH": str(root)}
                command = [sys.executable, __file__, "--child", kind, "frames"]
                run = subprocess.run(
                    command, env=environment, capture_output=True, text=True, check=True
                )
                python, own = map(float, run.stdout.split())
                print(f"  {name:<11}{python:>6.0f} Python frames, {own:.0f} the library's")
                continue
            per_call = (counted(root, kind, MANY) - counted(root, kind, FEW)) / (MANY - FEW)
            print(f"  {name:<11}{per_call:>10,.0f} instructions")


if __name__ == "__main__":
    main()
