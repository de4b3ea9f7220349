"""Facts about PostgreSQL that transactional calls rely on, checked on the real server with
raw SQL (asyncpg) rather than assumed.

A transactional call claims its key with the table's claim function (schema version 2),
which works in a subtransaction of its own, then opens a savepoint for the callback's
writes; the table's deferred guard trigger refuses a COMMIT while a transactional claim is
unfinished.  That is sound only if: the claim function's lock timeout, a caller's
statement_timeout or a client's cancellation — on the row or on the table — leave the
caller's transaction usable with its own ``lock_timeout``; the guard refuses exactly the
unfinished claims (also after ``SET CONSTRAINTS ALL IMMEDIATE``, not after the claim's
subtransaction rolled back); under REPEATABLE READ a claim meeting a record committed
after its snapshot fails with 40001 rather than answering from the stale snapshot.  The
savepoint facts below are the general ones the undo relies on (a duplicate blocked on a
row is released by ``ROLLBACK TO SAVEPOINT`` while the holder's transaction stays open; a
transaction-local setting follows its savepoint).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async.stores._postgres_schema import schema
from idempotency_async.stores._postgres_sql import statements
from idempotency_async.stores.postgres import REFUSED_COMMIT, create_table

pytestmark = pytest.mark.postgres

_LEASE = 30.0
_TTL = 3600.0


@pytest.fixture
async def table(postgres_server: PostgresServer) -> str:
    name = fresh_table_name()
    await create_table(postgres_server.dsn, table=name)
    return name


@pytest.fixture
async def connections(postgres_server: PostgresServer) -> AsyncIterator[list[Any]]:
    """Three connections: holder, duplicate, observer."""
    opened = [await postgres_server.connect() for _ in range(3)]
    try:
        yield opened
    finally:
        for connection in opened:
            connection.terminate()


async def _claim(connection: Any, table: str, key: str, owner: str, lock_wait: str = "30s") -> Any:
    """The store's own claim statement, judged by the server's clock, waiting at most
    ``lock_wait`` for a row lock."""
    return await connection.fetchrow(
        statements(table).claim, key, None, owner, _LEASE, _TTL, "validation", lock_wait
    )


async def _blocked_on_a_lock(observer: Any, connection: Any, seconds: float = 15.0) -> None:
    """Wait until ``connection``'s backend waits for a lock (not merely slow)."""
    pid = connection.get_server_pid()
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        wait = await observer.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
        )
        if wait == "Lock":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


async def _owner(observer: Any, table: str, key: str) -> Any:
    return await observer.fetchrow(f'SELECT status, owner FROM "{table}" WHERE key = $1', key)


async def test_rolling_back_the_savepoint_of_a_new_row_releases_a_blocked_claim(
    table: str, connections: list[Any]
) -> None:
    holder, duplicate, observer = connections
    await holder.execute("BEGIN")
    await holder.execute("SAVEPOINT idempotency_async")
    first = await _claim(holder, table, "k", "holder")
    assert (first["status"], first["owner"]) == ("INPROGRESS", "holder")

    await duplicate.execute("BEGIN")
    blocked = asyncio.create_task(_claim(duplicate, table, "k", "duplicate"))
    try:
        await _blocked_on_a_lock(observer, duplicate)
        assert not blocked.done()
        await holder.execute("ROLLBACK TO SAVEPOINT idempotency_async")
        # Released by the savepoint's rollback alone: the holder's transaction is still open.
        second = await asyncio.wait_for(blocked, timeout=10)
    finally:
        if not blocked.done():
            blocked.cancel()
    assert (second["status"], second["owner"]) == ("INPROGRESS", "duplicate")
    assert holder.is_in_transaction()
    assert await holder.fetchval("SELECT 1") == 1  # usable, not aborted
    await duplicate.execute("COMMIT")
    await holder.execute("COMMIT")
    row = await _owner(observer, table, "k")
    assert (row["status"], row["owner"]) == ("INPROGRESS", "duplicate")


async def test_rolling_back_the_savepoint_of_a_rewritten_row_releases_a_blocked_claim(
    table: str, connections: list[Any]
) -> None:
    holder, duplicate, observer = connections
    # A committed record whose lease is over: claimable, so the holder's claim rewrites it
    # (ON CONFLICT DO UPDATE) and holds its row lock.
    await observer.execute(
        f'INSERT INTO "{table}" (key, status, owner, expires_at, lease_ends_at) '
        "VALUES ('k', 'INPROGRESS', 'crashed', now() + interval '1 hour', "
        "now() - interval '1 second')"
    )
    await holder.execute("BEGIN")
    await holder.execute("SAVEPOINT idempotency_async")
    first = await _claim(holder, table, "k", "holder")
    assert (first["status"], first["owner"]) == ("INPROGRESS", "holder")

    await duplicate.execute("BEGIN")
    blocked = asyncio.create_task(_claim(duplicate, table, "k", "duplicate"))
    try:
        await _blocked_on_a_lock(observer, duplicate)
        await holder.execute("ROLLBACK TO SAVEPOINT idempotency_async")
        second = await asyncio.wait_for(blocked, timeout=10)
    finally:
        if not blocked.done():
            blocked.cancel()
    assert (second["status"], second["owner"]) == ("INPROGRESS", "duplicate")
    assert await holder.fetchval("SELECT 1") == 1
    await duplicate.execute("COMMIT")
    await holder.execute("COMMIT")
    row = await _owner(observer, table, "k")
    assert (row["status"], row["owner"]) == ("INPROGRESS", "duplicate")


async def test_a_blocked_claim_sees_the_committed_completion_and_does_not_write(
    table: str, connections: list[Any]
) -> None:
    # The other way a lock wait ends: the holder completes in its savepoint and commits;
    # the duplicate's claim answers with the COMPLETED row (its replay), owner untouched.
    holder, duplicate, observer = connections
    sql = statements(table)
    await holder.execute("BEGIN")
    await holder.execute("SAVEPOINT idempotency_async")
    await _claim(holder, table, "k", "holder")
    await duplicate.execute("BEGIN")
    blocked = asyncio.create_task(_claim(duplicate, table, "k", "duplicate"))
    try:
        await _blocked_on_a_lock(observer, duplicate)
        done = await holder.fetchrow(
            sql.complete, "k", "holder", None, _TTL, "validation", '{"v": 1}', None
        )
        assert done is not None
        await holder.execute("RELEASE SAVEPOINT idempotency_async")
        await holder.execute("COMMIT")
        answer = await asyncio.wait_for(blocked, timeout=10)
    finally:
        if not blocked.done():
            blocked.cancel()
    assert (answer["status"], answer["owner"], answer["response"]) == (
        "COMPLETED",
        "holder",
        '{"v": 1}',
    )
    await duplicate.execute("COMMIT")
    row = await _owner(observer, table, "k")
    assert (row["status"], row["owner"]) == ("COMPLETED", "holder")


async def _lock_timeout(connection: Any) -> str:
    value: str = await connection.fetchval("SHOW lock_timeout")
    return value


@pytest.mark.parametrize("end", ["ROLLBACK TO SAVEPOINT", "RELEASE SAVEPOINT"])
async def test_a_transaction_local_lock_timeout_follows_its_savepoint(
    connections: list[Any], end: str
) -> None:
    connection = connections[0]
    await connection.execute("BEGIN")
    await connection.execute("SET LOCAL lock_timeout = '7s'")  # the caller's own setting
    await connection.execute("SAVEPOINT idempotency_async")
    await connection.execute("SELECT set_config('lock_timeout', '25ms', true)")
    assert await _lock_timeout(connection) == "25ms"
    await connection.execute(f"{end} idempotency_async")
    if end.startswith("ROLLBACK"):
        assert await _lock_timeout(connection) == "7s"  # reverted with the savepoint
        await connection.execute("RELEASE SAVEPOINT idempotency_async")
        assert await _lock_timeout(connection) == "7s"
    else:
        assert await _lock_timeout(connection) == "25ms"  # kept until the transaction ends
    await connection.execute("COMMIT")
    assert await _lock_timeout(connection) == "0"  # the session's value again


async def test_a_lock_timeout_inside_the_savepoint_leaves_the_outer_transaction_usable(
    table: str, connections: list[Any]
) -> None:
    holder, duplicate, observer = connections
    await holder.execute("BEGIN")
    await _claim(holder, table, "k", "holder")
    await duplicate.execute("BEGIN")
    await duplicate.execute("CREATE TEMP TABLE effects (n int) ON COMMIT DROP")
    await duplicate.execute("INSERT INTO effects VALUES (1)")
    await duplicate.execute("SAVEPOINT idempotency_async")
    started = time.monotonic()
    with pytest.raises(Exception) as timed_out:
        await _claim(duplicate, table, "k", "duplicate", lock_wait="50ms")
    assert getattr(timed_out.value, "sqlstate", None) == "55P03"
    assert time.monotonic() - started < 5
    await duplicate.execute("ROLLBACK TO SAVEPOINT idempotency_async")
    await duplicate.execute("RELEASE SAVEPOINT idempotency_async")
    # The caller's own writes before the call survive; its transaction goes on.
    assert await duplicate.fetchval("SELECT count(*) FROM effects") == 1
    assert await _lock_timeout(duplicate) == "0"
    await duplicate.execute("COMMIT")
    await holder.execute("ROLLBACK")
    assert await _owner(observer, table, "k") is None


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
async def test_a_claim_meeting_a_record_committed_after_its_snapshot_is_a_serialization_failure(
    table: str, connections: list[Any], isolation: str
) -> None:
    holder, duplicate, observer = connections
    sql = statements(table)
    await duplicate.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    await duplicate.fetchval("SELECT 1")  # the snapshot is taken here
    await holder.execute("BEGIN")
    await _claim(holder, table, "k", "holder")
    await holder.fetchrow(sql.complete, "k", "holder", None, _TTL, "validation", '"done"', None)
    await holder.execute("COMMIT")
    # The snapshot does not see the COMPLETED record: a replay from it is impossible, and
    # the claim must not take the row either.
    with pytest.raises(Exception) as failed:
        await _claim(duplicate, table, "k", "duplicate")
    assert getattr(failed.value, "sqlstate", None) == "40001"
    await duplicate.execute("ROLLBACK")
    row = await _owner(observer, table, "k")
    assert (row["status"], row["owner"]) == ("COMPLETED", "holder")


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
async def test_a_claim_blocked_under_repeatable_read_fails_when_the_holder_commits(
    table: str, connections: list[Any], isolation: str
) -> None:
    holder, duplicate, observer = connections
    sql = statements(table)
    await holder.execute("BEGIN")
    await _claim(holder, table, "k", "holder")
    await duplicate.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    blocked = asyncio.create_task(_claim(duplicate, table, "k", "duplicate"))
    try:
        await _blocked_on_a_lock(observer, duplicate)
        await holder.fetchrow(sql.complete, "k", "holder", None, _TTL, "validation", '"done"', None)
        await holder.execute("COMMIT")
        with pytest.raises(Exception) as failed:
            await asyncio.wait_for(blocked, timeout=10)
    finally:
        if not blocked.done():
            blocked.cancel()
    assert getattr(failed.value, "sqlstate", None) == "40001"
    await duplicate.execute("ROLLBACK")
    row = await _owner(observer, table, "k")
    assert (row["status"], row["owner"]) == ("COMPLETED", "holder")


async def test_a_claim_under_repeatable_read_replays_a_record_its_snapshot_sees(
    table: str, connections: list[Any]
) -> None:
    # The counterpart: a record committed before the snapshot answers the claim, no error.
    holder, duplicate, observer = connections
    sql = statements(table)
    await _claim(holder, table, "k", "holder")
    await holder.fetchrow(sql.complete, "k", "holder", None, _TTL, "validation", '"done"', None)
    await duplicate.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    answer = await _claim(duplicate, table, "k", "duplicate")
    assert (answer["status"], answer["owner"], answer["response"]) == (
        "COMPLETED",
        "holder",
        '"done"',
    )
    await duplicate.execute("COMMIT")
    assert (await _owner(observer, table, "k"))["owner"] == "holder"


async def _fn_claim(
    connection: Any, table: str, key: str, owner: str | None, lock_wait: str | None = "30s"
) -> Any:
    """The table's claim function, as a transactional call calls it."""
    return await connection.fetchrow(
        schema(table).claim, key, owner, _TTL, "validation", lock_wait, 1_000_000
    )


async def test_the_claim_function_bounds_its_wait_and_leaves_the_caller_s_transaction_usable(
    table: str, connections: list[Any]
) -> None:
    # A lock timeout inside the function rolls back only its own subtransaction: no error
    # reaches the caller's transaction, whose lock_timeout is its own again, claimed or not.
    holder, duplicate, _ = connections
    await holder.execute("BEGIN")
    assert (await _fn_claim(holder, table, "held", "holder"))["answer"] == "claimed"
    await duplicate.execute("BEGIN")
    await duplicate.execute("SET LOCAL lock_timeout = '7s'")
    await duplicate.execute("CREATE TEMP TABLE mine (n int) ON COMMIT DROP")
    await duplicate.execute("INSERT INTO mine VALUES (1)")
    started = time.monotonic()
    answer = await _fn_claim(duplicate, table, "held", "me", "50ms")
    assert answer["answer"] == "55P03"
    assert time.monotonic() - started < 3  # its own 50 ms, not the caller's 7 s
    assert await _lock_timeout(duplicate) == "7s"
    assert (await _fn_claim(duplicate, table, "free", "me", "50ms"))["answer"] == "claimed"
    assert await _lock_timeout(duplicate) == "7s"
    assert await duplicate.fetchval("SELECT count(*) FROM mine") == 1  # not aborted
    await duplicate.execute(f"DELETE FROM \"{table}\" WHERE key = 'free'")
    await duplicate.execute("COMMIT")
    assert await _lock_timeout(duplicate) == "0"
    # Nothing of the library's carries over to the session's next transaction.
    await duplicate.execute("BEGIN")
    unfinished = await duplicate.fetchval(
        "SELECT current_setting('idempotency_async.unfinished', true)"
    )
    assert unfinished in (None, "")
    await duplicate.execute("COMMIT")
    await holder.execute("ROLLBACK")


@pytest.mark.parametrize("how", ["lock_timeout", "statement_timeout", "client_cancel"])
async def test_a_claim_waiting_for_a_table_lock_is_bounded_and_harmless(
    table: str, connections: list[Any], how: str
) -> None:
    # A migration holding ACCESS EXCLUSIVE on the table: the claim function's own
    # lock_timeout covers it (the lock is taken inside the function), so does a caller's
    # statement_timeout, and a client-side cancel is caught — the caller's transaction
    # stays usable in every case.
    migration, caller, _ = connections
    await migration.execute("BEGIN")
    await migration.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
    await caller.execute("BEGIN")
    started = time.monotonic()
    if how == "lock_timeout":
        answer = (await _fn_claim(caller, table, "k", "me", "100ms"))["answer"]
        assert answer == "55P03"
    elif how == "statement_timeout":
        await caller.execute("SET LOCAL statement_timeout = '100ms'")
        answer = await _fn_claim(caller, table, "k", "me", "30s")
        assert (answer["answer"], "statement timeout" in answer["not_stored"]) == ("57014", True)
    else:
        with pytest.raises(asyncio.TimeoutError):
            await caller.fetchrow(
                schema(table).claim, "k", "me", _TTL, "v", "30s", 1000, timeout=0.1
            )
    assert time.monotonic() - started < 5
    assert await caller.fetchval("SELECT 1") == 1  # the transaction is not aborted
    await caller.execute("COMMIT")
    await migration.execute("ROLLBACK")


async def test_the_guard_refuses_a_commit_of_an_unfinished_claim_and_nothing_else(
    table: str, connections: list[Any]
) -> None:
    connection, _, observer = connections
    sql = schema(table)
    # Unfinished: the COMMIT is refused with the guard's SQLSTATE, and nothing commits.
    await connection.execute("BEGIN")
    await _fn_claim(connection, table, "unfinished", "a")
    with pytest.raises(Exception) as refused:
        await connection.execute("COMMIT")
    assert getattr(refused.value, "sqlstate", None) == REFUSED_COMMIT
    assert not connection.is_in_transaction()
    assert await _owner(observer, table, "unfinished") is None
    # Completed: commits.  Deleted (a failed call undone): commits.  A caller's savepoint
    # rolled back over the claim: its event went with it, commits.
    await connection.execute("BEGIN")
    await _fn_claim(connection, table, "done", "b")
    await connection.fetchrow(sql.complete, "done", "b", _TTL, "validation", '"r"', None)
    await _fn_claim(connection, table, "undone", "c")
    await connection.execute(f"DELETE FROM \"{table}\" WHERE key = 'undone'")
    await connection.execute("SAVEPOINT caller")
    await _fn_claim(connection, table, "rolled-back", "d")
    await connection.execute("ROLLBACK TO SAVEPOINT caller")
    await connection.execute("COMMIT")
    assert (await _owner(observer, table, "done"))["status"] == "COMPLETED"
    assert await _owner(observer, table, "rolled-back") is None


async def test_set_constraints_all_immediate_neither_breaks_a_claim_nor_passes_the_guard(
    table: str, connections: list[Any]
) -> None:
    connection, _, observer = connections
    sql = schema(table)
    # Before the claim: the claim re-defers the guard, so it succeeds, and the completed
    # call commits.
    await connection.execute("BEGIN")
    await connection.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert (await _fn_claim(connection, table, "k", "a"))["answer"] == "claimed"
    await connection.fetchrow(sql.complete, "k", "a", _TTL, "validation", '"r"', None)
    await connection.execute("COMMIT")
    assert (await _owner(observer, table, "k"))["status"] == "COMPLETED"
    # During an unfinished call: the statement switching to immediate is refused.
    await connection.execute("BEGIN")
    await _fn_claim(connection, table, "j", "b")
    with pytest.raises(Exception) as refused:
        await connection.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert getattr(refused.value, "sqlstate", None) == REFUSED_COMMIT
    await connection.execute("ROLLBACK")


async def test_a_row_this_transaction_left_unfinished_is_never_taken_over(
    table: str, connections: list[Any]
) -> None:
    # A second claim of the key in the same transaction answers "mine" instead of taking
    # the row its earlier, unfinished claim wrote (whose callback's writes are still there).
    connection, _, _ = connections
    await connection.execute("BEGIN")
    await connection.execute("SET LOCAL lock_timeout = '7s'")
    assert (await _fn_claim(connection, table, "k", "first", "50ms"))["answer"] == "claimed"
    assert (await _fn_claim(connection, table, "k", "second", "50ms"))["answer"] == "mine"
    assert await _lock_timeout(connection) == "7s"  # its own again, whatever the answer
    await connection.execute("ROLLBACK")


async def test_a_claim_function_read_is_a_read(table: str, connections: list[Any]) -> None:
    connection, _, observer = connections
    await connection.execute("BEGIN")
    await connection.execute("SET LOCAL lock_timeout = '7s'")
    nothing = await _fn_claim(connection, table, "k", None, "50ms")
    assert (nothing["answer"], nothing["status"]) == ("read", None)
    assert await _lock_timeout(connection) == "7s"
    await connection.execute("COMMIT")
    assert await _owner(observer, table, "k") is None


async def test_a_transactional_completion_without_a_response_keeps_the_owners_response(
    table: str, connections: list[Any]
) -> None:
    # The store's own rule (a response is final), in the transactional completion's SQL:
    # the owner's row that holds a response keeps every column, and the answer says so.
    holder, _, observer = connections
    complete = schema(table).complete
    await holder.execute("BEGIN")
    await _claim(holder, table, "k", "holder")
    written = await holder.fetchrow(complete, "k", "holder", _TTL, "v", '{"body": 1}', None)
    assert written["written"] is True
    before = await holder.fetchrow(f'SELECT * FROM "{table}" WHERE key = $1', "k")
    kept = await holder.fetchrow(complete, "k", "holder", _TTL + 60, "v", None, "stream")
    assert kept["written"] is False
    assert await holder.fetchrow(f'SELECT * FROM "{table}" WHERE key = $1', "k") == before
    stranger = await holder.fetchrow(complete, "k", "other", _TTL, "v", None, "stream")
    assert stranger["written"] is None
    await holder.execute("COMMIT")
    row = await observer.fetchrow(f'SELECT response, not_stored FROM "{table}" WHERE key = $1', "k")
    assert (row["response"], row["not_stored"]) == ('{"body": 1}', None)
