"""One worker process of the transactional-step crash tests (tests/test_postgres_steps.py).

Usage:
  python _postgres_steps_worker.py DSN TABLE POINT
      runs the call of {"id": "order", "body": 1} (key prefix "steps", lease 1 s): three
      transactional steps on one asyncpg connection, each inserting ``n`` into TABLE_fx, and
      SIGKILLs itself at POINT: "in2" (step two's insert made, before its COMMIT) or
      "after2" (step two committed, before step three).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import asyncpg

from idempotency_async import Manager, Options, step
from idempotency_async.stores.postgres import PostgresStore


async def main(dsn: str, table: str, point: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    conn = await asyncpg.connect(dsn)
    manager = Manager(
        PostgresStore(pool, table=table),
        Options(key_prefix="steps", event_key_jmespath="id", payload_validation_jmespath="body"),
    )

    def insert(n: int) -> Any:
        async def run() -> dict[str, int]:
            await conn.execute(f"INSERT INTO {table}_fx VALUES ('fx', $1)", n)
            if point == f"in{n}":
                os.kill(os.getpid(), signal.SIGKILL)
            return {"n": n}

        return run

    async def work() -> str:
        for n in (1, 2, 3):
            await step(f"step-{n}", insert(n), connection=conn)
            if point == f"after{n}":
                os.kill(os.getpid(), signal.SIGKILL)
        return "done"

    await manager.execute({"id": "order", "body": 1}, work, timeout=1.0)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
