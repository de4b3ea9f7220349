"""Postgres: the Manager and the store against the same raw SQL statements, and idemkit.

    python benchmarks/bench_postgres.py            # full run (about a minute)
    python benchmarks/bench_postgres.py --smoke    # a few seconds, for CI
    python benchmarks/bench_postgres.py --durable  # commits flushed to disk (fsync on)
    python benchmarks/bench_postgres.py --concurrent 16 [--durable]
                                                   # transactional vs lease mode, 16 callers

The script starts its own PostgreSQL (``initdb`` into a temporary directory, a free
loopback port, ``fsync=off``: what is measured is the client and the statements, not the
disk — unless ``--durable``, which keeps PostgreSQL's defaults, so that every commit waits
for its WAL flush; as the ``postgres`` user when run as root).  Without the server
binaries it says so and exits 0 (CI installs them).

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

Transactional calls (for asyncpg and for psycopg 3, each on its own pool of the same
size; every call borrows a connection and writes one row into an effects table):
  raw-tx   what a hand-written transactional version runs: BEGIN; the claim statement; the
           effect INSERT; the completion UPDATE; COMMIT (replay: BEGIN; the claim meeting
           the completed record; COMMIT)
  tx       BEGIN; ``Manager.execute_in_transaction`` (its savepoint and all) with the same
           effect INSERT; COMMIT
  lease    ``Manager.execute`` whose callback runs the effect INSERT in its own transaction:
           three commits (the claim, the effect, the completion)
Their round trips are counted on the wire by a loopback proxy (turns of the conversation:
a client write after the server's answer), after a warm-up, so the drivers' prepared
statements and the pool's own traffic (asyncpg resets a connection it takes back) count.
Budget (transactional, counting the caller's BEGIN and COMMIT, not the pool's reset): a
first call at most 6, a replay at most 3.

``--concurrent N``: only the transactional paths, N callers at once per path (each on a
pool of N connections per driver, each caller making its calls one after another); the
time per call is the round's wall time over its calls.  Budget: tx at most 0.7x lease on
first calls.  The table's guard trigger fires at every transactional COMMIT: its cost is in.

One round = N sequential calls of one path; the paths' rounds are interleaved (the order
rotates every repeat) and the medians of the per-round means are compared.  Budget: the
manager's time per call at most 1.10x raw's.  Round trips (statements) are counted through
the pool in a separate, untimed pass: first call, replay, cached replay, in-progress
rejection (budget 2/1/0/1); and with recovery points: a first call taking two steps, one
failing after its first step, and its retry (budget 4/3/3: one round trip per recorded
step, none per replayed one).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _stats import paired, parse_args

from idempotency_async import LocalCache, Manager, Options, step
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


def start_postgres(durable: bool = False) -> Server | None:
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
    fast: tuple[str, ...] = ()
    if not durable:
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
        row = await self.pool.fetchrow(
            self.sql.claim, key, None, "owner", 10.0, 3600.0, "h", "10000ms"
        )
        assert row[0] == "INPROGRESS" and row[1] == "owner"
        done = await self.pool.fetchrow(
            self.sql.complete, key, "owner", None, 3600.0, "h", self.response, None
        )
        assert done is not None

    async def replay(self, key: str) -> None:
        row = await self.pool.fetchrow(
            self.sql.claim, key, None, "other", 10.0, 3600.0, "h", "10000ms"
        )
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
        Path_("raw", "first", looped(loop, lambda: raw.first(fresh()))),
        Path_("store", "first", looped(loop, store_first)),
        Path_(
            "manager", "first", looped(loop, lambda: manager_call(manager, order(uuid.uuid4().hex)))
        ),
        Path_("raw", "replay", looped(loop, lambda: raw.replay(replay_key))),
        Path_("manager", "replay", looped(loop, lambda: manager_call(manager, replay_order))),
    ]
    if not isinstance(idemkit, str):
        idemkit_order = order(uuid.uuid4().hex)

        async def idemkit_call(payload: dict[str, Any]) -> None:
            assert await idemkit(order=payload) == RESPONSE

        loop.run_until_complete(idemkit_call(idemkit_order))
        paths.insert(
            3, Path_("idemkit", "first", looped(loop, lambda: idemkit_call(order(fresh()))))
        )
        paths.append(Path_("idemkit", "replay", looped(loop, lambda: idemkit_call(idemkit_order))))
    return paths


# -- transactional calls ----------------------------------------------------------------

EFFECTS = "bench_effects"
DRIVERS = ("asyncpg", "psycopg")
TX_PATHS = ("raw-tx", "tx", "lease")


def percent_s(sql: str) -> tuple[str, tuple[int, ...]]:
    """``$n`` parameters as psycopg's ``%s``, and the order in which they are read (a
    number may repeat)."""
    order = tuple(int(number) - 1 for number in re.findall(r"\$(\d+)", sql))
    return re.sub(r"\$\d+", "%s", sql), order


class Driver:
    """One driver's pool, its manager, and the statements of the hand-written version."""

    def __init__(self, name: str, pool: Any) -> None:
        self.name = name
        self.pool = pool
        self.manager = Manager(PostgresStore(pool, table=TABLE), Options(key_prefix=name))
        sql = statements(TABLE)
        effect = f"INSERT INTO {EFFECTS} (id, n) VALUES ($1, $2)"
        import orjson

        self.response = orjson.dumps(RESPONSE).decode()
        self.claim, self.complete, self.effect = sql.claim, sql.complete, effect
        self._psycopg = {text: percent_s(text) for text in (sql.claim, sql.complete, effect)}

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A borrowed connection in a transaction (BEGIN ... COMMIT)."""
        if self.name == "psycopg":
            async with self.pool.connection() as conn, conn.transaction():
                yield conn
        else:
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn

    async def fetchrow(self, conn: Any, sql: str, *args: Any) -> Any:
        if self.name == "psycopg":
            text, order = self._psycopg[sql]
            return await (await conn.execute(text, [args[i] for i in order])).fetchone()
        return await conn.fetchrow(sql, *args)

    async def write(self, conn: Any, key: str) -> None:
        if self.name == "psycopg":
            await conn.execute(self._psycopg[self.effect][0], (key, 1))
        else:
            await conn.execute(self.effect, key, 1)

    async def autocommit_write(self, key: str) -> None:
        """The effect in its own transaction (one statement: an implicit one)."""
        if self.name == "psycopg":
            async with self.pool.connection() as conn:
                await conn.execute(self._psycopg[self.effect][0], (key, 1))
        else:
            await self.pool.execute(self.effect, key, 1)

    # -- the paths

    async def raw_first(self, key: str) -> None:
        async with self.transaction() as conn:
            row = await self.fetchrow(
                conn, self.claim, key, None, "owner", 10.0, 3600.0, "h", "10000ms"
            )
            assert row[0] == "INPROGRESS" and row[1] == "owner"
            await self.write(conn, key)
            done = await self.fetchrow(
                conn, self.complete, key, "owner", None, 3600.0, "h", self.response, None
            )
            assert done is not None

    async def raw_replay(self, key: str) -> None:
        async with self.transaction() as conn:
            row = await self.fetchrow(
                conn, self.claim, key, None, "other", 10.0, 3600.0, "h", "10000ms"
            )
            assert row[0] == "COMPLETED"

    async def tx_call(self, payload: dict[str, Any]) -> None:
        async with self.transaction() as conn:

            async def effect() -> dict[str, Any]:
                await self.write(conn, payload["id"])
                return RESPONSE

            result = await self.manager.execute_in_transaction(
                conn, payload, effect, timeout=TIMEOUT
            )
            assert result == RESPONSE

    async def lease_call(self, payload: dict[str, Any]) -> None:
        async def effect() -> dict[str, Any]:
            await self.autocommit_write(payload["id"])
            return RESPONSE

        assert await self.manager.execute(payload, effect, timeout=TIMEOUT) == RESPONSE

    def calls(
        self,
    ) -> tuple[dict[tuple[str, str], Callable[[], Awaitable[None]]], tuple[Awaitable[None], ...]]:
        """Each path's next call, by (path, kind), and the calls completing the replays'
        keys (to await first)."""
        raw_key = fresh()
        tx_order, lease_order = order(uuid.uuid4().hex), order(uuid.uuid4().hex)
        return {
            ("raw-tx", "first"): lambda: self.raw_first(fresh()),
            ("tx", "first"): lambda: self.tx_call(order(fresh())),
            ("lease", "first"): lambda: self.lease_call(order(fresh())),
            ("raw-tx", "replay"): lambda: self.raw_replay(raw_key),
            ("tx", "replay"): lambda: self.tx_call(tx_order),
            ("lease", "replay"): lambda: self.lease_call(lease_order),
        }, (self.raw_first(raw_key), self.tx_call(tx_order), self.lease_call(lease_order))


async def driver_pool(name: str, dsn: str, size: int) -> Any:
    if name == "psycopg":
        from psycopg_pool import AsyncConnectionPool

        url = dsn.replace("postgres://", "postgresql://")
        pool = AsyncConnectionPool(
            url, min_size=1, max_size=size, kwargs={"autocommit": True}, open=False
        )
        await pool.open()
        return pool
    import asyncpg

    return await asyncpg.create_pool(dsn, min_size=1, max_size=size)


async def close_pool(pool: Any) -> None:
    await pool.close()


def tx_paths(loop: asyncio.AbstractEventLoop, drivers: list[Driver]) -> list[Path_]:
    paths = []
    for driver in drivers:
        calls, setups = driver.calls()
        for setup in setups:
            loop.run_until_complete(setup)
        for (name, kind), call in calls.items():
            paths.append(Path_(f"{driver.name} {name}", kind, looped(loop, call)))
    return paths


def looped(
    loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[None]]
) -> Callable[[int], None]:
    async def calls(n: int) -> None:
        for _ in range(n):
            await call()

    return lambda n: loop.run_until_complete(calls(n))


class TurnCounter:
    """A loopback TCP proxy to the server counting the turns of every conversation through
    it: a client write that follows the server's answer is one round trip."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.turns = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writers += [writer, up_writer]
        answered = [True]  # the client speaks first

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, up: bool) -> None:
            while data := await source.read(65536):
                if up and answered[0]:
                    self.turns += 1
                answered[0] = not up
                sink.write(data)
                await sink.drain()
            sink.close()

        for pump_task in (
            asyncio.create_task(pump(reader, up_writer, True)),
            asyncio.create_task(pump(up_reader, writer, False)),
        ):
            self._pumps.add(pump_task)
            pump_task.add_done_callback(self._pumps.discard)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for pump_task in list(self._pumps):
            pump_task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()


def tx_round_trips(loop: asyncio.AbstractEventLoop, server: Server) -> dict[str, dict[str, int]]:
    """Round trips on the wire per call of each transactional path, by driver: each path
    warmed up (prepared statements) on a pool of one connection, then one call counted."""

    async def count() -> dict[str, dict[str, int]]:
        proxy = TurnCounter(server.port)
        port = await proxy.start()
        dsn = server.dsn.replace(f":{server.port}/", f":{port}/")
        trips: dict[str, dict[str, int]] = {}
        try:
            for name in DRIVERS:
                driver = Driver(name, await driver_pool(name, dsn, 1))
                try:
                    calls, setups = driver.calls()
                    for setup in setups:
                        await setup
                    for (path, kind), call in calls.items():
                        for _ in range(6):  # psycopg prepares a statement on its 5th use
                            await call()
                        before = proxy.turns
                        await call()
                        trips.setdefault(name, {})[f"{kind} {path}"] = proxy.turns - before
                finally:
                    await close_pool(driver.pool)
        finally:
            await proxy.close()
        return trips

    return loop.run_until_complete(count())


TX_BUDGET = 0.7  # tx / lease time per call on first calls, N concurrent callers
TX_TRIPS = {"first": 6, "replay": 3}  # counting BEGIN and COMMIT, not the pool's reset


def concurrent_paths(
    loop: asyncio.AbstractEventLoop, drivers: list[Driver], callers: int
) -> list[Path_]:
    """Each transactional path with ``callers`` callers at once: a round of n calls is
    ``callers`` tasks making n / ``callers`` calls each (fresh keys, or the one replayed
    key), so ``Path_`` divides the round's wall time by n."""
    paths = []
    for driver in drivers:
        calls, setups = driver.calls()
        for setup in setups:
            loop.run_until_complete(setup)
        for (name, kind), call in calls.items():
            paths.append(Path_(f"{driver.name} {name}", kind, gathered(loop, call, callers)))
    return paths


def gathered(
    loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[None]], callers: int
) -> Callable[[int], None]:
    async def caller(n: int) -> None:
        for _ in range(n):
            await call()

    async def round_(n: int) -> None:
        await asyncio.gather(*(caller(max(1, n // callers)) for _ in range(callers)))

    return lambda n: loop.run_until_complete(round_(n))


def concurrent_report(paths: list[Path_], callers: int, durable: bool) -> bool:
    by = {(p.name, p.kind): p for p in paths}
    print(
        f"Transactional calls, {callers} concurrent callers "
        f"({'durable commits' if durable else 'fsync off'}): wall time per call, medians"
    )
    print(f"  {'driver':<9}{'call':<8}{'raw-tx':>8}{'tx':>8}{'lease':>8}{'tx/lease':>10}")
    within = True
    for name in DRIVERS:
        for kind in ("first", "replay"):
            raw, tx, lease = (by[(f"{name} {path}", kind)] for path in TX_PATHS)
            ratio = tx.wall / lease.wall
            if kind == "first":
                within &= ratio <= TX_BUDGET
            print(
                f"  {name:<9}{kind:<8}{raw.wall * 1e6:8.0f}{tx.wall * 1e6:8.0f}"
                f"{lease.wall * 1e6:8.0f}{ratio:10.2f}"
            )
        ratios = sorted(
            a / b
            for a, b in zip(
                by[(f"{name} tx", "first")].walls, by[(f"{name} lease", "first")].walls, strict=True
            )
        )
        print(f"  {name:<9}first   tx/lease per round: {ratios[0]:.2f}-{ratios[-1]:.2f}")
    print(f"  budget tx/lease on first calls <= {TX_BUDGET}: {'met' if within else 'NOT met'}")
    return within


def tx_report(paths: list[Path_], trips: dict[str, dict[str, int]]) -> None:
    by = {(p.name, p.kind): p for p in paths}
    print("  transactional calls: medians, ratios of times, round trips on the wire")
    print(
        f"  {'driver':<9}{'call':<8}{'raw-tx':>8}{'tx':>8}{'lease':>8}{'tx/raw':>8}"
        f"{'lease/tx':>9}   client CPU raw-tx · tx · lease   round trips raw-tx · tx · lease"
    )
    print(f"  {'':<17}{'µs/call':>8}")
    for name in DRIVERS:
        for kind in ("first", "replay"):
            raw, tx, lease = (by[(f"{name} {path}", kind)] for path in TX_PATHS)
            counted = trips.get(name, {})
            cpu = " · ".join(f"{p.cpu * 1e6:.0f}" for p in (raw, tx, lease))
            rounds = " · ".join(str(counted.get(f"{kind} {path}", "?")) for path in TX_PATHS)
            print(
                f"  {name:<9}{kind:<8}{raw.wall * 1e6:8.0f}{tx.wall * 1e6:8.0f}"
                f"{lease.wall * 1e6:8.0f}{tx.wall / raw.wall:8.2f}{lease.wall / tx.wall:9.2f}"
                f"   {cpu:<31}{rounds}"
            )
            print(
                f"  {'':<17}within rounds, median (range): tx/raw-tx "
                f"{paired(tx.walls, raw.walls)}, lease/tx {paired(lease.walls, tx.walls)}; "
                f"CPU tx/raw-tx {paired(tx.cpus, raw.cpus)}"
            )


def round_trips(loop: asyncio.AbstractEventLoop, pool: Any) -> dict[str, int]:
    """Statements sent per call: first, replay, cached replay, in-progress rejection."""

    async def count() -> dict[str, int]:
        counting = CountingPool(pool)
        store = PostgresStore(counting, table=TABLE)
        cached = Manager(store, Options(key_prefix="trips", local_cache=LocalCache()))
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


def step_round_trips(loop: asyncio.AbstractEventLoop, pool: Any) -> dict[str, int]:
    """Statements sent per call with recovery points: a first call taking two steps, one
    failing after its first step (its release keeps it), and its retry (the claim's answer
    carries the recorded step: replayed without a round trip)."""

    async def count() -> dict[str, int]:
        counting = CountingPool(pool)
        manager = Manager(PostgresStore(counting, table=TABLE), Options(key_prefix="steps"))
        fail = [False]

        async def two_steps() -> dict[str, Any]:
            await step("one", lambda: asyncio.sleep(0, 1))
            if fail[0]:
                raise RuntimeError("after step one")
            await step("two", lambda: asyncio.sleep(0, 2))
            return RESPONSE

        trips = {}
        counting.sent = 0
        assert await manager.execute(order(uuid.uuid4().hex), two_steps, timeout=TIMEOUT)
        trips["two steps"] = counting.sent
        payload = order(uuid.uuid4().hex)
        fail[0], counting.sent = True, 0
        with contextlib.suppress(RuntimeError):
            await manager.execute(payload, two_steps, timeout=TIMEOUT)
        trips["failed after one"] = counting.sent
        fail[0], counting.sent = False, 0
        assert await manager.execute(payload, two_steps, timeout=TIMEOUT)
        trips["resumed"] = counting.sent
        return trips

    return loop.run_until_complete(count())


# -- report --------------------------------------------------------------------------


def report(paths: list[Path_], calls: int, repeats: int, durable: bool) -> bool:
    by = {(p.name, p.kind): p for p in paths}
    print(
        f"Postgres on loopback ({'durable commits' if durable else 'fsync off'}): "
        f"{calls} sequential calls per round, "
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
        line = (
            f"  {'':<7}within rounds, median (range): time manager/raw "
            f"{paired(manager.walls, raw.walls)}, CPU {paired(manager.cpus, raw.cpus)}"
        )
        if kind == "first":
            store = by[("store", kind)]
            line += f"; time store/raw {paired(store.walls, raw.walls)}"
        if idemkit is not None:
            line += (
                f"; idemkit/manager time {paired(idemkit.walls, manager.walls)}, "
                f"CPU {paired(idemkit.cpus, manager.cpus)}"
            )
        print(line)
    return within


def main() -> None:
    durable = "--durable" in sys.argv
    if durable:
        sys.argv.remove("--durable")
    callers = 0
    if "--concurrent" in sys.argv:
        at = sys.argv.index("--concurrent")
        callers = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    args = parse_args(__doc__ or "")
    if callers:
        concurrent_main(callers, durable, args.smoke, args.repeats)
        return
    calls, repeats = (20, 3) if args.smoke else (100, 21)
    repeats = args.repeats or repeats
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    server = start_postgres(durable)
    if server is None:
        print("bench_postgres: skipped — the PostgreSQL server binaries are not installed")
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # asyncpg's pool binds to the current loop
    drivers: list[Driver] = []
    try:
        import asyncpg

        pool = loop.run_until_complete(asyncpg.create_pool(server.dsn, min_size=1, max_size=10))
        loop.run_until_complete(create_table(pool, table=TABLE))
        idemkit = "not measured in --smoke" if args.smoke else idemkit_function(loop, server)
        if isinstance(idemkit, str):
            print(f"  idemkit: {idemkit}")
        loop.run_until_complete(pool.execute(f"CREATE TABLE {EFFECTS} (id text, n int)"))
        for name in DRIVERS:
            drivers.append(Driver(name, loop.run_until_complete(driver_pool(name, server.dsn, 10))))
        base = build_paths(loop, pool, idemkit)
        transactional = tx_paths(loop, drivers)
        paths = base + transactional
        for path in paths:  # warm up connections, prepared statements and code paths
            path.run(10)
        for repeat in range(repeats):
            shift = repeat % len(paths)
            for path in paths[shift:] + paths[:shift]:
                path.timed_round(calls)
        within = report(base, calls, repeats, durable)
        trips = round_trips(loop, pool)
        steps = step_round_trips(loop, pool)
        tx_counts = tx_round_trips(loop, server)
        tx_report(transactional, tx_counts)
        if not isinstance(idemkit, str):
            loop.run_until_complete(idemkit.backend.aclose())
        loop.run_until_complete(pool.close())
    finally:
        for driver in drivers:
            loop.run_until_complete(close_pool(driver.pool))
        loop.close()
        server.stop()
    print("  round trips per call: " + ", ".join(f"{k} {v}" for k, v in trips.items()))
    print("  with steps: " + ", ".join(f"{k} {v}" for k, v in steps.items()))
    tx_trips_ok = True
    for name, counted in tx_counts.items():
        reset = 1 if name == "asyncpg" else 0  # asyncpg's pool resets a returned connection
        for kind, budget in TX_TRIPS.items():
            got = counted[f"{kind} tx"] - reset
            tx_trips_ok &= got <= budget
            print(f"  {name} transactional {kind}: {got} round trips (budget {budget})")
    if not tx_trips_ok:
        raise SystemExit("transactional round trips over budget")
    if trips != {"first": 2, "replay": 1, "cached": 0, "in progress": 1}:
        raise SystemExit(f"round trips are not 2/1/0/1: {trips}")
    if steps != {"two steps": 4, "failed after one": 3, "resumed": 3}:
        raise SystemExit(f"round trips with steps are not 4/3/3: {steps}")
    if not within:
        if args.smoke:
            print("  (over budget: smoke runs are too short to judge; not failing)")
        else:
            raise SystemExit("over budget")


def concurrent_main(callers: int, durable: bool, smoke: bool, repeats: int | None) -> None:
    calls, rounds = (callers * 2, 3) if smoke else (callers * 12, repeats or 15)
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    server = start_postgres(durable)
    if server is None:
        print("bench_postgres: skipped — the PostgreSQL server binaries are not installed")
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    drivers: list[Driver] = []
    try:
        import asyncpg

        pool = loop.run_until_complete(asyncpg.create_pool(server.dsn, min_size=1, max_size=2))
        loop.run_until_complete(create_table(pool, table=TABLE))
        loop.run_until_complete(pool.execute(f"CREATE TABLE {EFFECTS} (id text, n int)"))
        loop.run_until_complete(pool.close())
        for name in DRIVERS:
            pool = loop.run_until_complete(driver_pool(name, server.dsn, callers))
            drivers.append(Driver(name, pool))
        paths = concurrent_paths(loop, drivers, callers)
        for path in paths:
            path.run(calls)  # warm up: every connection of every pool, prepared statements
        for repeat in range(rounds):
            shift = repeat % len(paths)
            for path in paths[shift:] + paths[:shift]:
                path.timed_round(calls)
        within = concurrent_report(paths, callers, durable)
    finally:
        for driver in drivers:
            loop.run_until_complete(close_pool(driver.pool))
        loop.close()
        server.stop()
    if not within and not smoke:
        print("  (over the budget)")


if __name__ == "__main__":
    main()
