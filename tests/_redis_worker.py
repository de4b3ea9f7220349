"""One worker process of the multi-process Redis tests.

Usage:
  python _redis_worker.py run PORT PREFIX SIDE_EFFECT_FILE WORKER_ID TASKS KEYS
      each task executes an idempotent call whose side effect appends one line to the file;
  python _redis_worker.py hold PORT PREFIX LEASE
      claims key {"id": "held"} and prints "holding" from a callback that never returns
      (the test SIGKILLs the process);
  python _redis_worker.py hold PORT PREFIX LEASE RENEW
      the same, with Options(renewal=Renewal(lease=RENEW)): the short lease is renewed
      while it holds.
"""

from __future__ import annotations

import asyncio
import os
import sys

import redis.asyncio as redis_asyncio

from idempotency_async import Manager, Options, Renewal, Wait
from idempotency_async.stores.redis import RedisStore


async def run(port: int, prefix: str, path: str, worker: str, tasks: int, keys: int) -> None:
    async with redis_asyncio.Redis(host="127.0.0.1", port=port) as client:
        store = RedisStore(client, key_prefix=prefix)
        manager = Manager(
            store, Options(key_prefix="multi", event_key_jmespath="id", wait=Wait(timeout=60))
        )
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:

            async def call(n: int) -> None:
                key_id = n % keys

                async def side_effect() -> str:
                    # O_APPEND makes each line one atomic write across processes.
                    os.write(descriptor, f"{key_id} {worker}\n".encode())
                    await asyncio.sleep(0.01)
                    return f"done-{key_id}"

                result = await manager.execute({"id": key_id}, side_effect, timeout=60)
                assert result == f"done-{key_id}", result

            await asyncio.gather(*(call(n) for n in range(tasks)))
        finally:
            os.close(descriptor)


async def hold(port: int, prefix: str, lease: float, renew: float | None = None) -> None:
    async with redis_asyncio.Redis(host="127.0.0.1", port=port) as client:
        options = Options(
            key_prefix="kill", renewal=None if renew is None else Renewal(lease=renew)
        )
        manager = Manager(RedisStore(client, key_prefix=prefix), options)

        async def forever() -> None:
            print("holding", flush=True)
            await asyncio.sleep(3600)

        await manager.execute({"id": "held"}, forever, timeout=lease)


if __name__ == "__main__":
    mode, port, prefix, *rest = sys.argv[1:]
    if mode == "run":
        path, worker, tasks, keys = rest
        asyncio.run(run(int(port), prefix, path, worker, int(tasks), int(keys)))
    else:
        renew = float(rest[1]) if len(rest) > 1 else None
        asyncio.run(hold(int(port), prefix, float(rest[0]), renew))
