"""How many connections a transactional FastAPI route holds, in each of its two pools.

    python benchmarks/bench_pool.py            # about 15 s
    python benchmarks/bench_pool.py --smoke    # a few seconds, for CI

A route on ``IdempotentTransaction`` uses two pools: the **application's** (the endpoint
opens its transaction on it; the claim, the work and the completion run there) and the
**store's** (the middleware reads the committed record there before the endpoint runs,
one statement, no transaction).  Scenario, on a local PostgreSQL (fsync off), served by
uvicorn, with ``wait=Wait(timeout=30)``: one slow request (its work takes ``SLOW`` s) and
``DUPLICATES`` concurrent duplicates of it, then ``OTHERS`` requests with keys of their
own.  Printed: the peak connections checked out of each pool, and the latency of the other
requests, for application pools of several sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import asyncpg
import httpx
from _http_apps import serve_asgi
from bench_postgres import start_postgres
from fastapi import FastAPI, Response

from idempotency_async import Manager, Wait
from idempotency_async.integrations.fastapi import IdempotentTransaction
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.postgres import PostgresStore, create_table


class Counted:
    """A pool that counts the connections checked out of it, and their peak."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.out, self.peak = pool, 0, 0

    def acquire(self) -> Any:
        counted = self

        class _Acquire:
            async def __aenter__(self) -> Any:
                self.cm = counted.pool.acquire()
                connection = await self.cm.__aenter__()
                counted.out += 1
                counted.peak = max(counted.peak, counted.out)
                return connection

            async def __aexit__(self, *exc: Any) -> None:
                counted.out -= 1
                await self.cm.__aexit__(*exc)

        return _Acquire()


def app(app_pool: Counted, store_pool: Any, slow: float) -> FastAPI:
    api = FastAPI()
    manager = Manager(PostgresStore(store_pool, table="records"))
    api.add_middleware(
        IdempotencyMiddleware,
        manager=manager,
        paths=(),
        wait=Wait(timeout=30),
        caller_scope=lambda request: "bench",
    )

    @api.post("/orders/{order_id}", status_code=201)
    async def create(order_id: str, tx: IdempotentTransaction) -> Response:
        async with app_pool.acquire() as connection, connection.transaction():

            async def work() -> dict[str, str]:
                await connection.execute("INSERT INTO orders VALUES ($1)", order_id)
                if order_id == "slow":
                    await asyncio.sleep(slow)
                return {"id": order_id}

            return await tx.run(connection, work)

    return api


async def scenario(
    dsn: str, size: int, duplicates: int, others: int, slow: float
) -> dict[str, Any]:
    setup = await asyncpg.connect(dsn)
    await setup.execute("DROP TABLE IF EXISTS orders, records")
    await create_table(setup, table="records")
    await setup.execute("CREATE TABLE orders (id text)")
    await setup.close()
    raw_app_pool = await asyncpg.create_pool(dsn, min_size=size, max_size=size)
    raw_store_pool = await asyncpg.create_pool(dsn, min_size=10, max_size=10)
    app_pool = Counted(raw_app_pool)
    store_peak = 0

    async def watch_store() -> None:
        nonlocal store_peak
        while True:
            in_use = raw_store_pool.get_size() - raw_store_pool.get_idle_size()
            store_peak = max(store_peak, in_use)
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch_store())
    try:
        async with (
            serve_asgi(app(app_pool, raw_store_pool, slow)) as url,
            httpx.AsyncClient(
                base_url=url, timeout=60, limits=httpx.Limits(max_connections=200)
            ) as client,
        ):
            first = asyncio.create_task(
                client.post("/orders/slow", headers={"Idempotency-Key": "slow"})
            )
            await asyncio.sleep(0.1)
            waiting = [
                asyncio.create_task(
                    client.post("/orders/slow", headers={"Idempotency-Key": "slow"})
                )
                for _ in range(duplicates)
            ]
            await asyncio.sleep(0.2)

            async def other(n: int) -> float:
                started = time.perf_counter()
                answer = await client.post(f"/orders/o{n}", headers={"Idempotency-Key": f"o{n}"})
                assert answer.status_code == 201, answer.text
                return time.perf_counter() - started

            latencies = await asyncio.gather(*(other(n) for n in range(others)))
            answers = await asyncio.gather(first, *waiting)
            assert all(a.status_code == 201 for a in answers), [a.status_code for a in answers]
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await raw_app_pool.close()
        await raw_store_pool.close()
    return {
        "app pool size": size,
        "app pool peak": app_pool.peak,
        "store pool peak": store_peak,
        "others median ms": round(statistics.median(latencies) * 1000, 1),
        "others max ms": round(max(latencies) * 1000, 1),
    }


async def main_async(dsn: str, smoke: bool) -> None:
    slow, duplicates, others = (0.5, 4, 4) if smoke else (2.0, 8, 8)
    sizes = (6,) if smoke else (4, 8, 10, 20)
    print(
        f"one request whose work takes {slow} s, {duplicates} duplicates waiting on it, "
        f"then {others} requests with keys of their own (wait=Wait(timeout=30))"
    )
    for size in sizes:
        print(await scenario(dsn, size, duplicates, others, slow))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    server = start_postgres()
    if server is None:
        raise SystemExit("no PostgreSQL binaries (initdb) found")
    try:
        asyncio.run(main_async(f"postgres://postgres@127.0.0.1:{server.port}/postgres", args.smoke))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
