"""Postgres: the Manager and the store against the same raw SQL statements, and idemkit.

    python benchmarks/bench_postgres.py            # full run (about a minute)
    python benchmarks/bench_postgres.py --smoke    # a few seconds, for CI

The script starts its own PostgreSQL (``initdb`` into a temporary directory, a free
loopback port, ``fsync=off``: what is measured is the client and the statements, not the
disk; as the ``postgres`` user when run as root).  Without the server binaries it says so
and exits 0 (CI installs them).

First calls (a fresh key each call):
  raw      the store's two statements (claim, complete) through ``pool.fetchrow``, with
           their arguments prebuilt: the round trips any Postgres store has to make
  store    the same two statements through ``PostgresStore.claim`` + ``complete``
  manager  ``Manager.execute(payload, callback, timeout=...)`` on that store
  idemkit  idemkit's ``@idempotent`` on its ``PostgresBackend`` (the same server and pool
           size), installed into a temporary directory; skipped when pip cannot get it
Replays (one completed key, called again and again):
  raw      the claim statement meeting the completed record (it answers with the record)
  manager  ``Manager.execute`` of that key (no local cache)
  idemkit  the decorated function called again with the same payload

One round = N sequential calls of one path; the paths' rounds are interleaved (the order
rotates every repeat) and the medians of the per-round means are compared.  Budget: the
manager's time per call at most 1.10x raw's.  Round trips (statements) are counted through
the pool in a separate, untimed pass: first call, replay, cached replay, in-progress
rejection (budget 2/1/0/1).
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _stats import parse_args

from idempotency_async import Manager, Options
from idempotency_async.stores._postgres_sql import statements
from idempotency_async.stores.postgres import PostgresStore, create_table

BUDGET = 1.10
TIMEOUT = 10.0
RESPONSE = {"order": 123, "status": "ACCEPTED", "amount": 10.5, "items": ["a", "b"]}
TABLE = "bench_records"


# -- the server ----------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    directory: str

    @property
    def dsn(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        self.process.send_signal(2)  # SIGINT: a fast shutdown
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres() -> Server | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    initdb = found[0] if found else shutil.which("initdb")
    if initdb is None:
        return None
    binaries = Path(initdb).resolve().parent
    drop: dict[str, Any] = {}
    directory = tempfile.mkdtemp(prefix="bench-postgres-")
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        drop = {"user": "postgres", "group": "postgres", "extra_groups": []}
        shutil.chown(directory, "postgres", "postgres")
    data = str(Path(directory, "data"))
    subprocess.run(
        [str(binaries / "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True,
        capture_output=True,
        cwd=directory,
        **drop,
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fast = ("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
    fast = (*fast, "-k", directory)
    process = subprocess.Popen(
        [str(binaries / "postgres"), *("-D", data, "-p", str(port)), *("-h", "127.0.0.1"), *fast],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        cwd=directory,
        **drop,
    )
    server = Server(process, port, directory)
    deadline = time.monotonic() + 30
    while True:
        ready = subprocess.run(
            [str(binaries / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)],
            capture_output=True,
        )
        if ready.returncode == 0:
            return server
        if time.monotonic() > deadline or process.poll() is not None:
            server.stop()
            raise SystemExit("postgres did not start")
        time.sleep(0.05)


# -- the paths -----------------------------------------------------------------------


def order(order_id: str) -> dict[str, Any]:
    return {"id": order_id, "amount": 10.5, "currency": "EUR"}


async def respond() -> dict[str, Any]:
    return RESPONSE


async def manager_call(manager: Manager, payload: dict[str, Any]) -> None:
    assert await manager.execute(payload, respond, timeout=TIMEOUT) == RESPONSE


class CountingPool:
    """A real asyncpg pool that counts the statements sent through it."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.sent = 0

    async def fetchrow(self, *args: Any) -> Any:
        self.sent += 1
        return await self._pool.fetchrow(*args)


@dataclass
class Raw:
    """The store's statements called straight through asyncpg, arguments prebuilt."""

    pool: Any
    sql: Any = None
    response: str = ""

    def __post_init__(self) -> None:
        self.sql = statements(TABLE)
        import orjson

        self.response = orjson.dumps(RESPONSE).decode()

    async def first(self, key: str) -> None:
        row = await self.pool.fetchrow(self.sql.claim, key, None, "owner", 10.0, 3600.0, "h")
        assert row[0] == "INPROGRESS" and row[1] == "owner"
        done = await self.pool.fetchrow(
            self.sql.complete, key, "owner", None, 3600.0, "h", self.response, None
        )
        assert done is not None

    async def replay(self, key: str) -> None:
        row = await self.pool.fetchrow(self.sql.claim, key, None, "other", 10.0, 3600.0, "h")
        assert row[0] == "COMPLETED"


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


def idemkit_function(loop: asyncio.AbstractEventLoop, server: Server) -> Any:
    """idemkit's decorated function on its own Postgres backend, or the reason it is not
    available.  Installed into a temporary directory: not a dependency of this project."""
    target = tempfile.mkdtemp(prefix="bench-idemkit-")
    installed = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps"),
            *("--target", target, "idemkit==1.0.2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if installed.returncode != 0:
        return f"pip install idemkit failed: {installed.stderr.strip()[-300:]}"
    sys.path.append(target)
    try:
        from idemkit import MethodConfig, PostgresBackend, idempotent
        from idemkit.backends.postgres import init_pg
    except ImportError as exc:
        return f"idemkit did not import: {exc}"
    loop.run_until_complete(init_pg(server.dsn, table="idemkit_records"))
    backend = PostgresBackend.from_url(server.dsn, table="idemkit_records", min_size=1, max_size=10)

    async def process(order: dict[str, Any]) -> dict[str, Any]:
        return RESPONSE

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no scope": one tenant is the point
        process = idempotent(backend=backend, config=MethodConfig(key_fields=["order"]))(process)

    process.backend = backend
    return process


def build_paths(loop: asyncio.AbstractEventLoop, pool: Any, idemkit: Any) -> list[Path_]:
    raw = Raw(pool)
    store = PostgresStore(pool, table=TABLE)
    manager = Manager(store, Options(key_prefix="bench"))

    def looped(call: Callable[[], Awaitable[None]]) -> Callable[[int], None]:
        async def calls(n: int) -> None:
            for _ in range(n):
                await call()

        return lambda n: loop.run_until_complete(calls(n))

    async def store_first() -> None:
        from idempotency_async._json import encode_json
        from idempotency_async.record import Claim, Completion

        key, now = fresh(), time.time()
        await store.claim(Claim(key, "owner", now, 10.0, 3600.0, "h"))
        done = Completion(key, "owner", now, 3600.0, "h", encode_json(RESPONSE), RESPONSE)
        await store.complete(done)

    replay_key = fresh()
    loop.run_until_complete(raw.first(replay_key))
    replay_order = order(uuid.uuid4().hex)
    loop.run_until_complete(manager_call(manager, replay_order))
    paths = [
        Path_("raw", "first", looped(lambda: raw.first(fresh()))),
        Path_("store", "first", looped(store_first)),
        Path_("manager", "first", looped(lambda: manager_call(manager, order(uuid.uuid4().hex)))),
        Path_("raw", "replay", looped(lambda: raw.replay(replay_key))),
        Path_("manager", "replay", looped(lambda: manager_call(manager, replay_order))),
    ]
    if not isinstance(idemkit, str):
        idemkit_order = order(uuid.uuid4().hex)

        async def idemkit_call(payload: dict[str, Any]) -> None:
            assert await idemkit(order=payload) == RESPONSE

        loop.run_until_complete(idemkit_call(idemkit_order))
        paths.insert(3, Path_("idemkit", "first", looped(lambda: idemkit_call(order(fresh())))))
        paths.append(Path_("idemkit", "replay", looped(lambda: idemkit_call(idemkit_order))))
    return paths


def round_trips(loop: asyncio.AbstractEventLoop, pool: Any) -> dict[str, int]:
    """Statements sent per call: first, replay, cached replay, in-progress rejection."""

    async def count() -> dict[str, int]:
        counting = CountingPool(pool)
        store = PostgresStore(counting, table=TABLE)
        cached = Manager(store, Options(key_prefix="trips", use_local_cache=True))
        other = Manager(store, Options(key_prefix="trips"))
        payload = order(uuid.uuid4().hex)
        trips = {}
        for name, manager in (("first", cached), ("replay", other), ("cached", cached)):
            counting.sent = 0
            await manager_call(manager, payload)
            trips[name] = counting.sent
        started, release = asyncio.Event(), asyncio.Event()

        async def hold() -> dict[str, Any]:
            started.set()
            await release.wait()
            return RESPONSE

        slow = order(uuid.uuid4().hex)
        holder = asyncio.create_task(cached.execute(slow, hold, timeout=TIMEOUT))
        await started.wait()
        counting.sent = 0
        try:
            await manager_call(other, slow)
        except Exception:  # AlreadyInProgressError
            trips["in progress"] = counting.sent
        release.set()
        await holder
        return trips

    return loop.run_until_complete(count())


# -- report --------------------------------------------------------------------------


def report(paths: list[Path_], calls: int, repeats: int) -> bool:
    by = {(p.name, p.kind): p for p in paths}
    print(
        f"Postgres on loopback (fsync off): {calls} sequential calls per round, "
        f"{repeats} interleaved rounds per path"
    )
    print(
        f"  {'path':<16}{'µs/call':>9}{'client CPU':>12}\n  {'':<16}{'(median)':>9}{'µs/call':>12}"
    )
    for p in paths:
        print(f"  {p.kind + ' ' + p.name:<16}{p.wall * 1e6:9.0f}{p.cpu * 1e6:12.0f}")
    within = True
    for kind in ("first", "replay"):
        raw, manager = by[("raw", kind)], by[("manager", kind)]
        ratio = manager.wall / raw.wall
        ok = ratio <= BUDGET
        within &= ok
        line = (
            f"  {kind:<7}time manager/raw {ratio:.3f} ({'within' if ok else 'OVER'} the "
            f"{BUDGET:.2f}x budget); client CPU above raw {(manager.cpu - raw.cpu) * 1e6:.0f} µs"
        )
        if kind == "first":
            line += f", store/raw time {by[('store', kind)].wall / raw.wall:.3f}"
        idemkit = by.get(("idemkit", kind))
        if idemkit is not None:
            line += f"; idemkit/manager time {idemkit.wall / manager.wall:.2f}"
        print(line)
    return within


def main() -> None:
    args = parse_args(__doc__ or "")
    calls, repeats = (20, 3) if args.smoke else (100, 21)
    repeats = args.repeats or repeats
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    server = start_postgres()
    if server is None:
        print("bench_postgres: skipped — the PostgreSQL server binaries are not installed")
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # asyncpg's pool binds to the current loop
    try:
        import asyncpg

        pool = loop.run_until_complete(asyncpg.create_pool(server.dsn, min_size=1, max_size=10))
        loop.run_until_complete(create_table(pool, table=TABLE))
        idemkit = "not measured in --smoke" if args.smoke else idemkit_function(loop, server)
        if isinstance(idemkit, str):
            print(f"  idemkit: {idemkit}")
        paths = build_paths(loop, pool, idemkit)
        for path in paths:  # warm up connections, prepared statements and code paths
            path.run(10)
        for repeat in range(repeats):
            shift = repeat % len(paths)
            for path in paths[shift:] + paths[:shift]:
                path.timed_round(calls)
        within = report(paths, calls, repeats)
        trips = round_trips(loop, pool)
        if not isinstance(idemkit, str):
            loop.run_until_complete(idemkit.backend.aclose())
        loop.run_until_complete(pool.close())
    finally:
        loop.close()
        server.stop()
    print("  round trips per call: " + ", ".join(f"{k} {v}" for k, v in trips.items()))
    if trips != {"first": 2, "replay": 1, "cached": 0, "in progress": 1}:
        raise SystemExit(f"round trips are not 2/1/0/1: {trips}")
    if not within:
        if args.smoke:
            print("  (over budget: smoke runs are too short to judge; not failing)")
        else:
            raise SystemExit("over budget")


if __name__ == "__main__":
    main()
