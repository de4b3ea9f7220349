"""One worker process of the multi-process test: tasks sharing keys through DynamoDB.

Usage: python _worker.py ENDPOINT TABLE SIDE_EFFECT_FILE WORKER_ID TASKS KEYS [TRANSPORT]
Each task executes an idempotent call whose side effect appends one line to the file.
"""

from __future__ import annotations

import asyncio
import os
import sys

from _moto import open_transport

from idempotency_async import Manager, Options, Wait
from idempotency_async.stores.dynamodb import DynamoDBStore


async def main(
    endpoint: str, table: str, path: str, worker: str, tasks: int, keys: int, transport: str
) -> None:
    store = DynamoDBStore(
        client_factory=lambda: open_transport(transport, endpoint), table_name=table
    )
    async with store:
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


if __name__ == "__main__":
    endpoint, table, path, worker, tasks, keys = sys.argv[1:7]
    transport = sys.argv[7] if len(sys.argv) > 7 else "aioboto3"
    asyncio.run(main(endpoint, table, path, worker, int(tasks), int(keys), transport))
