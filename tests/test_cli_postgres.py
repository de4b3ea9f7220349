"""The ``idempotency-async`` command on ``postgres://`` stores, against a real postgres."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from _cli import cli
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres


async def test_every_record_command_speaks_postgres(postgres_server: PostgresServer) -> None:
    table = fresh_table_name()
    url = f"{postgres_server.dsn}?table={table}"
    created = await cli("create-table", "--store", url)
    assert table in created.ok()
    assert table in (await cli("create-table", "--store", url)).ok()  # idempotent
    async with PostgresStore.from_url(postgres_server.dsn, table=table) as store:
        manager = Manager(store, Options(key_prefix="shop", event_key_jmespath="order_id"))
        for order in (9, 10):
            await manager.execute({"order_id": order}, lambda: asyncio.sleep(0, {"ok": 1}))
        key = manager.key_for({"order_id": 9})
    derived, got, listed, completed = await asyncio.gather(
        cli("key", "--prefix", "shop", "--jmespath", "order_id", stdin='{"order_id": 9}'),
        cli("get", "--store", url, str(key), "--json", "--show-response"),
        cli("list", "--store", url, "--json", "--page-size", "1"),
        cli("list", "--store", url, "--status", "INPROGRESS"),
    )
    assert derived.ok().strip() == key
    record = got.json()
    assert record["status"] == "COMPLETED" and record["response"] == {"ok": 1}
    rows = [json.loads(line) for line in listed.ok().splitlines()]
    assert sorted(row["key"] for row in rows) == sorted(
        [str(key), str(manager.key_for({"order_id": 10}))]
    )
    assert "0 records" in completed.err
    released = await cli("release", "--store", url, str(key), "--yes", "--json")
    assert json.loads(released.ok())["deleted"]["key"] == key
    gone = await cli("get", "--store", url, str(key))
    assert "no record" in gone.error(code=3)


async def test_create_table_prints_the_sql_for_migrations(postgres_server: PostgresServer) -> None:
    table = fresh_table_name()
    printed = (
        await cli("create-table", "--store", f"postgres://db/app?table={table}", "--print-sql")
    ).ok()
    assert printed.startswith(f'CREATE TABLE IF NOT EXISTS "{table}"')
    assert f'ON "{table}" (expires_at);' in printed
    connection = await postgres_server.connect()
    try:
        await connection.execute(printed)
        assert await connection.fetchval(f'SELECT count(*) FROM "{table}"') == 0
    finally:
        await connection.close()


async def test_vacuum_deletes_expired_records(postgres_server: PostgresServer) -> None:
    table = fresh_table_name()
    url = f"{postgres_server.dsn}?table={table}"
    (await cli("create-table", "--store", url)).ok()
    connection = await postgres_server.connect()
    try:
        await connection.execute(
            f"INSERT INTO {table} SELECT 'old' || i, 'COMPLETED', 'x', "
            f"to_timestamp({time.time() - 60}), NULL, NULL, '1', NULL "
            "FROM generate_series(1, 7) i"
        )
        vacuumed = await cli("vacuum", "--store", url, "--batch-size", "3", "--max-batches", "2")
        assert "deleted 6 expired records" in vacuumed.ok()
        # Stopped by --max-batches after a full batch: it says more may remain, and how to
        # go on.
        assert "stopped after --max-batches 2 with the last batch full" in vacuumed.out
        assert "more expired records may remain; run the command again" in vacuumed.out
        assert await connection.fetchval(f"SELECT count(*) FROM {table}") == 1
        rest = await cli("vacuum", "--store", url, "--batch-size", "3", "--max-batches", "2")
        assert rest.ok() == f"deleted 1 expired record from {table}\n"  # done: nothing more
        assert await connection.fetchval(f"SELECT count(*) FROM {table}") == 0
        assert (await cli("vacuum", "--store", url)).ok() == (
            f"deleted 0 expired records from {table}\n"
        )
    finally:
        await connection.close()


async def test_list_limit_reads_what_it_shows_and_says_whether_more_remain(
    postgres_server: PostgresServer,
) -> None:
    from idempotency_async.record import Claim
    from idempotency_async.stores.postgres import create_table

    table = fresh_table_name()
    url = f"{postgres_server.dsn}?table={table}"
    await create_table(postgres_server.dsn, table=table)
    async with PostgresStore.from_url(postgres_server.dsn, table=table) as store:
        for i in range(5):
            await store.claim(Claim(f"k{i}", "o", 0, 300.0, 3600.0, None))
    s = ("--store", url)
    two, five, held = await asyncio.gather(
        cli("list", *s, "--limit", "2"),
        cli("list", *s, "--limit", "5", "--json"),
        cli("list", *s, "--limit", "2", "--status", "INPROGRESS", "--page-size", "2"),
    )
    # One statement of limit + 1 rows (not a page of 1000): the extra row says more remain.
    assert [row.split()[-1] for row in two.ok().splitlines()[1:]] == ["k0", "k1"]
    assert two.err == "2 records shown, stopped at --limit 2: more remain (read 3 items)\n"
    assert [json.loads(line)["key"] for line in five.ok().splitlines()] == [
        f"k{i}" for i in range(5)
    ]
    assert five.err == "5 records (read 5 items)\n"
    # With a --page-size the limit fell on a page's end: one page more tells.
    assert held.err == "2 records shown, stopped at --limit 2: more remain (read 4 items)\n"


async def test_postgres_usage_errors_are_one_line() -> None:
    wrong, bad_table, print_redis = await asyncio.gather(
        cli("vacuum", "--store", "redis://127.0.0.1:1/0"),
        cli("get", "--store", "postgres://db/app?table=a;b", "k"),
        cli("create-table", "--store", "redis://127.0.0.1:1/0", "--print-sql"),
    )
    assert "vacuum is for postgres://" in wrong.error()
    assert "table name" in bad_table.error()
    assert "--print-sql is for postgres://" in print_redis.error()


async def test_an_unreachable_postgres_is_a_one_line_error() -> None:
    down = await cli("get", "--store", "postgres://postgres@127.0.0.1:1/postgres", "k")
    assert "Postgres" in down.error()


async def test_the_postgres_target_lists_the_stores_records_page_by_page(
    postgres_server: PostgresServer,
) -> None:
    from idempotency_async.cli._schemes import parse_target
    from idempotency_async.cli._targets import AwsSettings
    from idempotency_async.record import Claim, Status

    table = fresh_table_name()
    target: Any = parse_target(f"{postgres_server.dsn}?table={table}")
    await target.create_table()
    store = target.store(AwsSettings())
    try:
        for key in ("a", "b", "c"):
            await store.claim(Claim(key, "o", 0, 30.0, 60.0, None))
        pages = [page async for page in target.pages(store, status=Status.INPROGRESS, page_size=2)]
    finally:
        await store.aclose()
    assert [[record.key for record in page.records] for page in pages] == [["a", "b"], ["c"]]
    assert [page.scanned for page in pages] == [2, 1]


async def test_dates_python_cannot_show_are_shown_without_a_traceback(
    postgres_server: PostgresServer,
) -> None:
    # Postgres holds years 4713 BC to 294276 AD; Python's calendar ends at 1 and 9999.
    table = fresh_table_name()
    url = f"{postgres_server.dsn}?table={table}"
    connection = await postgres_server.connect()
    try:
        await create_table(connection, table=table)
        await connection.execute(
            f'INSERT INTO "{table}" (key, status, owner, expires_at, lease_ends_at) VALUES '
            "('far', 'INPROGRESS', 'o', '294276-12-31 23:59:59+00', '4713-01-01 00:00:00+00 BC')"
        )
    finally:
        await connection.close()
    shown, as_json = await asyncio.gather(
        cli("get", "--store", url, "far"), cli("get", "--store", url, "far", "--json")
    )
    assert "beyond the calendar" in shown.ok()
    record = as_json.json()
    assert record["expires_at"] is None and record["expiration"] > 9_000_000_000_000


async def test_migrate_brings_a_version_1_table_to_the_current_schema(
    postgres_server: PostgresServer,
) -> None:
    # A table as create-table made it before schema version 2: no guard, no claim function;
    # a transactional call on it is refused with the migration to run.
    from idempotency_async import errors
    from idempotency_async.stores._postgres_sql import table_ddl
    from idempotency_async.stores.postgres import SCHEMA_VERSION, migration_sql

    table = fresh_table_name()
    url = f"{postgres_server.dsn}?table={table}"
    connection = await postgres_server.connect()
    pool = await postgres_server.pool()
    try:
        for statement in table_ddl(table):
            await connection.execute(statement)
        store = PostgresStore(pool, table=table)
        manager = Manager(store, Options(key_prefix="m", event_key_jmespath="id"))

        async def transactional() -> Any:
            async with pool.acquire() as conn, conn.transaction():
                return await manager.execute_in_transaction(
                    conn, {"id": 1}, lambda: asyncio.sleep(0, "done")
                )

        with pytest.raises(errors.ConfigError, match="idempotency-async migrate") as refused:
            await transactional()
        assert "CREATE CONSTRAINT TRIGGER" in str(refused.value)  # the DDL, for a DBA
        printed = (await cli("migrate", "--store", url, "--print-sql")).ok()
        assert printed == migration_sql(table)
        assert "CREATE TABLE" not in printed  # only what version 2 adds
        migrated = await cli("migrate", "--store", url)
        assert f"schema version {SCHEMA_VERSION}" in migrated.ok()
        assert "schema version" in (await cli("migrate", "--store", url)).ok()  # idempotent
        assert await transactional() == "done"
        comment = await connection.fetchval(f"SELECT obj_description('\"{table}\"'::regclass)")
        assert comment == f"idempotency-async records, schema {SCHEMA_VERSION}"
    finally:
        await pool.close()
        await connection.close()


async def test_migrate_is_for_postgres_only() -> None:
    failed = await cli("migrate", "--store", "redis://localhost:1/0")
    assert "migrate is for postgres://" in failed.error()
