"""One worker process of the multi-process transactional-call tests.

Usage:
  python _postgres_tx_worker.py run DSN TABLE WORKER_ID TASKS KEYS SEED
      TASKS concurrent tasks over KEYS keys, each in its own transaction on its own
      connection: the caller writes an ``attempts`` row, claims through
      ``execute_in_transaction`` with a callback that writes an ``effects`` row, then
      commits — with a fault drawn per task from SEED.  Prints one JSON line per task;
  python _postgres_tx_worker.py hold DSN TABLE
      claims key {"id": "held"} in an open transaction, prints "holding" from a callback
      that never returns (the test SIGKILLs the process).

Tables (created by the test): TABLE (the records), TABLE_effects (key, writer) and
TABLE_attempts (writer).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Any

import asyncpg

from idempotency_async import LocalCache, Manager, Options, Wait
from idempotency_async.stores.postgres import PostgresStore

FAULTS = (
    "none",
    "none",
    "none",
    "raise_commit",  # the callback raises; the caller commits what it has
    "raise_rollback",  # the callback raises; the caller rolls back
    "rollback_after_return",  # the call returned; the caller rolls back
    "terminate_backend",  # pg_terminate_backend from another connection, in the callback
    "close_socket",  # the client drops the connection in the callback
    "commit_unanswered",  # COMMIT sent, the connection killed before its answer
)
WAITS = ("off", "on", "short")


class Planned(Exception):
    """What a callback raises on purpose."""


def _options(wait: str) -> Options:
    return Options(
        key_prefix="tx",
        event_key_jmespath="id",
        wait=None if wait == "off" else Wait(timeout=0.03 if wait == "short" else 20.0),
        local_cache=LocalCache(),  # never read nor filled by a transactional call
    )


async def run(dsn: str, table: str, worker: str, tasks: int, keys: int, seed: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10)
    killer = await asyncpg.connect(dsn)
    killing = asyncio.Lock()
    store = PostgresStore(pool, table=table)
    managers = {wait: Manager(store, _options(wait)) for wait in WAITS}
    effects, attempts = f'"{table}_effects"', f'"{table}_attempts"'

    async def task(n: int) -> dict[str, Any]:
        rng = random.Random(f"{seed}-{worker}-{n}")
        key = rng.randrange(keys)
        fault = rng.choice(FAULTS)
        wait = rng.choice(WAITS)
        writer = f"{worker}-{n}"
        pause = rng.uniform(0.01, 0.06)
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        line: dict[str, Any] = {"key": key, "writer": writer, "fault": fault, "wait": wait}
        line.update(value=None, error=None, ran=False, committed=False)

        async def callback() -> str:
            line["ran"] = True
            await conn.execute(f"INSERT INTO {effects} VALUES ($1, $2)", str(key), writer)
            await asyncio.sleep(pause)  # duplicates meet the row locked meanwhile
            if fault.startswith("raise"):
                raise Planned(writer)
            if fault == "terminate_backend":
                async with killing:
                    await killer.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
            elif fault == "close_socket":
                conn.terminate()
            return writer

        async with pool.acquire() as conn:
            line["pid"] = conn.get_server_pid()
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute(f"INSERT INTO {attempts} VALUES ($1)", writer)
            try:
                line["value"] = await managers[wait].execute_in_transaction(
                    conn, {"id": key}, callback, timeout=20
                )
            except Exception as exc:
                line["error"] = type(exc).__name__
                line["detail"] = f"{exc!r} from {exc.__cause__!r}"[:300]
            if _gone(conn):
                return line
            if fault == "commit_unanswered":
                commit = asyncio.ensure_future(conn.execute("COMMIT"))
                await asyncio.sleep(0)  # written to the socket, not answered yet
                conn.terminate()
                try:
                    await commit
                    line["committed"] = True
                except Exception:
                    line["committed"] = None  # unknown: the test finds out from the tables
                return line
            if fault in ("raise_rollback", "rollback_after_return") or (
                line["error"] is not None and not line["error"].endswith(_USABLE)
            ):
                try:
                    await transaction.rollback()
                except Exception as exc:
                    line["rollback_error"] = type(exc).__name__
                return line
            try:
                await transaction.commit()
                line["committed"] = True
            except Exception as exc:
                line["commit_error"] = type(exc).__name__
            return line

    try:
        for line in await asyncio.gather(*(task(n) for n in range(tasks))):
            print(json.dumps(line), flush=True)
    finally:
        await killer.close()
        await pool.close()


# The errors after which the caller's transaction is still usable (only the library's
# savepoint was rolled back): the caller commits its own writes.
_USABLE = ("Planned", "AlreadyInProgressError", "LockTimeoutError")


async def hold(dsn: str, table: str) -> None:
    connection = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    manager = Manager(PostgresStore(pool, table=table), Options(key_prefix="kill"))
    async with connection.transaction():

        async def forever() -> str:
            print("holding", flush=True)
            await asyncio.sleep(3600)
            return "never"

        await manager.execute_in_transaction(connection, {"id": "held"}, forever)


def _gone(connection: Any) -> bool:
    """Whether the connection was closed or terminated (a pool's proxy of a terminated
    connection refuses every method, this one too)."""
    try:
        return bool(connection.is_closed())
    except Exception:
        return True


if __name__ == "__main__":
    mode, dsn, table, *rest = sys.argv[1:]
    if mode == "run":
        worker, tasks, keys, seed = rest
        asyncio.run(run(dsn, table, worker, int(tasks), int(keys), seed))
    else:
        asyncio.run(hold(dsn, table))
