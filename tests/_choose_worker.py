"""A worker that dies right after its callback's effect (``os._exit``: no cleanup, no
store write, its sockets closed by the kernel), for the rows of docs/choose.md.

Usage: python _choose_worker.py MODE DSN RECORDS EFFECTS KEY [PROVIDER_URL]

MODE is ``lease`` (a lease of LEASE s), ``renewal`` (a 60 s deadline, a renewed lease of
LEASE s),
``transactional`` (the effect written through the call's own transaction) or
``downstream`` (lease mode; the effect is a provider call carrying a downstream key).
It prints ``effect`` just before it dies.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import asyncpg
import httpx

from idempotency_async import Manager, Options, Renewal, downstream_key
from idempotency_async.stores.postgres import PostgresStore

# What each mode's worker and the test's retry use (docs/choose.md, "How each row is tested").
# Generous: the callback (a local insert or HTTP call) must finish within it, under load.
LEASE = 2.0
OPTIONS = {
    "lease": {},
    "renewal": {"renewal": Renewal(lease=LEASE)},
    "transactional": {},
    "downstream": {},
}
TIMEOUT = {"lease": LEASE, "renewal": 60.0, "transactional": 60.0, "downstream": LEASE}


def manager(store: PostgresStore, mode: str) -> Manager:
    return Manager(store, Options(key_prefix="choose", event_key_jmespath="id", **OPTIONS[mode]))


async def effect(mode: str, effects: str, key: str, connection: Any, provider: str) -> str:
    """The side effect: a committed row (in the call's transaction when transactional),
    or a provider call."""
    if mode == "downstream":
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{provider}/charges", headers={"Idempotency-Key": downstream_key("charge")}
            )
            return str(answer.json()["charge"])
    await connection.execute(f"INSERT INTO {effects} (key, pid) VALUES ($1, $2)", key, os.getpid())
    return "done"


async def main(mode: str, dsn: str, records: str, effects: str, key: str, provider: str) -> None:
    store = PostgresStore.from_url(dsn, table=records)
    connection = await asyncpg.connect(dsn)
    payload = {"id": key}

    async def die_after_the_effect() -> str:
        await effect(mode, effects, key, connection, provider)
        print("effect", flush=True)
        os._exit(17)  # the process dies: no completion, no release

    if mode == "transactional":
        async with connection.transaction():
            await manager(store, mode).execute_in_transaction(
                connection, payload, die_after_the_effect, timeout=TIMEOUT[mode]
            )
    else:
        await manager(store, mode).execute(payload, die_after_the_effect, timeout=TIMEOUT[mode])


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(*args[:5], args[5] if len(args) > 5 else ""))
