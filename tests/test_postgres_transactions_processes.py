"""Transactional calls on a real postgres, across OS processes: exactly once for the
database effect.

Four processes share 20 keys; every task claims in its own transaction on its own
connection, its callback writes an effect row through that connection, and the caller
commits — or the callback raises, the caller rolls back after the call returned, the
connection is terminated or dropped mid-transaction, the COMMIT is never answered, a lock
wait times out.  Afterwards the tables say what committed, and every caller's answer is
checked against them.  Then a holder SIGKILLed in its open transaction frees its key at
once, and REPEATABLE READ / SERIALIZABLE duplicates get a serialization error, never a
replay their snapshot cannot see.

``TX_PROCESS_TASKS=200 python -m pytest tests/test_postgres_transactions_processes.py``
runs a larger round (tasks per process; CI runs 50).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options, Wait, errors
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres

_WORKER = Path(__file__).with_name("_postgres_tx_worker.py")
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}
PROCESSES = 4
TASKS = int(os.environ.get("TX_PROCESS_TASKS", "50"))
KEYS = 20
# Two rounds of other draws; TX_PROCESS_SEED=N runs round N alone.
SEEDS = [os.environ["TX_PROCESS_SEED"]] if "TX_PROCESS_SEED" in os.environ else ["25", "26"]
# What a caller may get besides a result: its callback's own exception, a refusal or a
# lock timeout, and CompletionError when its connection died before the completion.
_DROPPED = ("terminate_backend", "close_socket", "commit_unanswered")
_DOCUMENTED = {"Planned", "AlreadyInProgressError", "LockTimeoutError", "CompletionError"}


async def _worker(*args: str, **options: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(_WORKER), *args, env=_ENV, **options
    )


async def _tables(server: PostgresServer) -> str:
    table = fresh_table_name()
    await create_table(server.dsn, table=table)
    connection = await server.connect()
    try:
        await connection.execute(f'CREATE TABLE "{table}_effects" (key text, writer text)')
        await connection.execute(f'CREATE TABLE "{table}_attempts" (writer text)')
    finally:
        await connection.close()
    return table


@pytest.mark.parametrize("seed", SEEDS)
async def test_four_processes_commit_one_effect_per_completed_key(
    postgres_server: PostgresServer, seed: str
) -> None:
    table = await _tables(postgres_server)
    processes = [
        await _worker(
            "run",
            postgres_server.dsn,
            table,
            f"w{n}",
            str(TASKS),
            str(KEYS),
            seed,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(PROCESSES)
    ]
    lines: list[dict[str, Any]] = []
    try:
        for process in processes:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
            assert process.returncode == 0, stderr.decode()[-3000:]
            lines += [json.loads(line) for line in stdout.decode().splitlines()]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()
    assert len(lines) == PROCESSES * TASKS

    connection = await postgres_server.connect()
    try:
        # A COMMIT whose client went away may still be applying: wait for its backend.
        dropped = [line["pid"] for line in lines if line["fault"] in _DROPPED]
        give_up = time.monotonic() + 30
        while await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", dropped
        ):
            assert time.monotonic() < give_up, "the dropped connections' backends live on"
            await asyncio.sleep(0.01)
        records = {
            row["key"]: row
            for row in await connection.fetch(
                f'SELECT key, status, response::text AS response FROM "{table}"'
            )
        }
        effects: dict[str, list[str]] = defaultdict(list)
        for row in await connection.fetch(f'SELECT key, writer FROM "{table}_effects"'):
            effects[row["key"]].append(row["writer"])
        attempts = Counter(
            row["writer"]
            for row in await connection.fetch(f'SELECT writer FROM "{table}_attempts"')
        )
    finally:
        await connection.close()

    # Which record belongs to which test key: the one whose effect row names its writer.
    by_writer = {line["writer"]: line for line in lines}
    assert all(record["status"] == "COMPLETED" for record in records.values()), records
    completed: dict[str, str] = {}  # test key -> the committed run's writer
    for record in records.values():
        writer = json.loads(record["response"])
        completed[str(by_writer[writer]["key"])] = writer
    assert len(completed) == len(records)  # one record per test key
    problems = []
    for key in map(str, range(KEYS)):
        written = effects.get(key, [])
        if key in completed:
            if written != [completed[key]]:
                problems.append(f"key {key}: record by {completed[key]}, effects {written}")
        elif written:
            problems.append(f"key {key}: no committed record, effects {written}")
    for line in lines:
        key, writer, value = str(line["key"]), line["writer"], line["value"]
        committed_run = value == writer and line["committed"] is True
        if committed_run and completed.get(key) != writer:
            problems.append(f"{writer} committed its run of key {key}: {completed.get(key)} won")
        if value is not None and value != writer and value != completed.get(key):
            problems.append(f"{writer} got {value!r} for key {key}: committed {completed.get(key)}")
        if line["error"] is not None and line["error"] not in _DOCUMENTED:
            problems.append(f"{writer} got {line['detail']}")
        if line["committed"] is True and attempts[writer] != 1:
            problems.append(f"{writer} committed but its own write is gone")
        if line["committed"] is False and attempts[writer] != 0:
            problems.append(f"{writer} did not commit but its own write is there")
    assert problems == []

    # Not vacuous: every fault was drawn, keys completed, callers replayed and were refused.
    faults = Counter(line["fault"] for line in lines)
    outcomes = Counter(
        line["error"] or ("run" if line["value"] == line["writer"] else "replay") for line in lines
    )
    print(f"faults {dict(faults)}; outcomes {dict(outcomes)}; {len(completed)} keys completed")
    assert set(faults) == {
        "none",
        "raise_commit",
        "raise_rollback",
        "rollback_after_return",
        "terminate_backend",
        "close_socket",
        "commit_unanswered",
    }
    assert len(completed) >= KEYS // 2
    assert outcomes["replay"] > 0 and outcomes["run"] > 0 and outcomes["Planned"] > 0


async def _blocked_on_a_lock(observer: Any, seconds: float = 15.0) -> int:
    """Wait until some backend waits for a row lock on a tuple or transaction; its pid."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        pid = await observer.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid() LIMIT 1"
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.01)
    raise AssertionError("no backend waited for a lock")


async def test_a_sigkilled_holder_frees_its_key_at_once_for_a_blocked_duplicate(
    postgres_server: PostgresServer,
) -> None:
    table = await _tables(postgres_server)
    process = await _worker("hold", postgres_server.dsn, table, stdout=asyncio.subprocess.PIPE)
    pool = await postgres_server.pool()
    observer = await postgres_server.connect()
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert line.strip() == b"holding"
        manager = Manager(
            PostgresStore(pool, table=table), Options(key_prefix="kill", wait=Wait(timeout=30))
        )
        ran_at: list[float] = []

        async def duplicate() -> str:
            async with pool.acquire() as connection, connection.transaction():

                async def work() -> str:
                    ran_at.append(time.monotonic())
                    return "second"

                result: str = await manager.execute_in_transaction(
                    connection, {"id": "held"}, work, timeout=30
                )
                return result

        blocked = asyncio.create_task(duplicate())
        try:
            await _blocked_on_a_lock(observer)
            assert not blocked.done()
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            assert await asyncio.wait_for(blocked, timeout=10) == "second"
        finally:
            if not blocked.done():
                blocked.cancel()
        waited = ran_at[0] - killed
        print(f"the duplicate ran {waited * 1000:.0f} ms after the SIGKILL")
        assert waited < 1.0
        row = await observer.fetchrow(f'SELECT status, response::text FROM "{table}"')
        assert tuple(row) == ("COMPLETED", '"second"')
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        await observer.close()
        await pool.close()


@pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
@pytest.mark.parametrize("when", ["snapshot_before_commit", "blocked_on_the_row"])
async def test_a_duplicate_under_snapshot_isolation_gets_a_serialization_failure(
    postgres_server: PostgresServer, isolation: str, when: str
) -> None:
    table = await _tables(postgres_server)
    pool = await postgres_server.pool()
    observer = await postgres_server.connect()
    try:
        manager = Manager(
            PostgresStore(pool, table=table),
            Options(key_prefix="iso", wait=Wait(timeout=30)),
        )
        effects = f'"{table}_effects"'

        def effect(connection: Any, writer: str) -> Any:
            async def callback() -> str:
                await connection.execute(f"INSERT INTO {effects} VALUES ('k', $1)", writer)
                return writer

            return callback

        holder = await pool.acquire()
        duplicate = await pool.acquire()
        try:
            holding = holder.transaction()
            await holding.start()
            snapshot = duplicate.transaction(isolation=isolation)
            await snapshot.start()
            if when == "snapshot_before_commit":
                await duplicate.fetchval("SELECT 1")  # the snapshot is taken here
                assert await manager.execute_in_transaction(
                    holder, {"id": 1}, effect(holder, "first")
                ) == ("first")
                await holding.commit()
                call = manager.execute_in_transaction(
                    duplicate, {"id": 1}, effect(duplicate, "second")
                )
                with pytest.raises(errors.SerializationFailureError) as failed:
                    await call
            else:
                assert await manager.execute_in_transaction(
                    holder, {"id": 1}, effect(holder, "first")
                ) == ("first")
                blocked = asyncio.create_task(
                    manager.execute_in_transaction(
                        duplicate, {"id": 1}, effect(duplicate, "second")
                    )
                )
                try:
                    await _blocked_on_a_lock(observer)
                    await holding.commit()
                    with pytest.raises(errors.SerializationFailureError) as failed:
                        await asyncio.wait_for(blocked, timeout=10)
                finally:
                    if not blocked.done():
                        blocked.cancel()
            assert isinstance(failed.value, errors.TransactionRetryError)
            await snapshot.rollback()
        finally:
            await pool.release(holder)
            await pool.release(duplicate)
        rows = await observer.fetch(f"SELECT writer FROM {effects}")
        assert [row["writer"] for row in rows] == ["first"]
        # Retried as the error says, in a new transaction: the replay.
        async with pool.acquire() as connection, connection.transaction(isolation=isolation):
            again = await manager.execute_in_transaction(
                connection, {"id": 1}, effect(connection, "third")
            )
        assert again == "first"
        assert await observer.fetchval(f"SELECT count(*) FROM {effects}") == 1
    finally:
        await observer.close()
        await pool.close()
