"""PostgresStore against a real postgres: what the contract suite does not pin — the
server's clock, exact jsonb numbers, responses jsonb cannot hold, rows as untrusted input,
the table helpers, vacuum, owned pools and error translation."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_postgres_store, fresh_table_name

from idempotency_async import errors
from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import CLAIMED, Found, Written
from idempotency_async.stores.postgres import (
    SCHEMA_VERSION,
    PostgresStore,
    create_table,
    table_sql,
)
from idempotency_async.testing import StoreContract

pytestmark = pytest.mark.postgres

NOW = 1_700_000_000.0


def _claim(key: str = "k", owner: str = "a", *, now: float = NOW, lease: float = 30) -> Claim:
    return Claim(key, owner, now, lease, 3600.0, "v")


def _done(key: str, value: Any, owner: str = "a", *, now: float = NOW) -> Completion:
    return Completion(key, owner, now, 3600.0, "v", encode_json(value), value)


async def test_the_server_clock_judges_whatever_now_the_client_sends(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server) as store:
        # A client clock years behind: the lease still ends 5 s after the server's now.
        assert await store.claim(_claim(now=NOW, lease=5)) is CLAIMED
        verdict = await store.claim(_claim(owner="b", now=time.time() + 3600))
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.retry_after is not None and 4 < verdict.retry_after <= 5
        record = verdict.record
        assert record is not None and record.lease_end is not None
        assert abs(record.lease_end - (time.time() + verdict.retry_after)) < 2
        read = await store.get("k", now=0)
        assert read.found is Found.IN_PROGRESS


async def test_a_completed_verdict_counts_its_life_by_the_server_clock(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server) as store:
        await store.claim(_claim(now=0))
        assert await store.complete(_done("k", 1, now=0)) is Written.RESPONSE
        verdict = await store.claim(_claim(owner="b", now=0))
        assert verdict.found is Found.COMPLETED
        assert verdict.expires_in is not None and 3598 < verdict.expires_in <= 3601


@pytest.mark.parametrize(
    "value",
    [
        1e300,
        -1.5e-10,
        5e-324,
        1.7976931348623157e308,
        1e16,
        2**64,
        -(2**63) - 1,
        10**40 + 1,
        0.1 + 0.2,
        {"text": "1e5 stays a string", "n": [1e22, 1.0, -0.5, 12345678901234567890]},
    ],
)
async def test_numbers_survive_jsonb_exactly_with_their_types(
    postgres_server: PostgresServer, value: Any
) -> None:
    async with fresh_postgres_store(postgres_server, judged_by="client") as store:
        await store.claim(_claim())
        assert await store.complete(_done("k", value)) is Written.RESPONSE
        record = (await store.get("k", now=NOW)).record
        assert record is not None and record.response == value
        assert _typed(record.response) == _typed(value)


def _typed(value: Any) -> Any:
    """``value`` with every leaf paired with its type (``1 == 1.0``; their types differ)."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize(
    ("encoded", "why"),
    [(b'"a\\u0000b"', "\\u0000"), (b'{"x":"\\ud800"}', "jsonb")],
)
async def test_a_response_jsonb_cannot_hold_completes_without_it(
    postgres_server: PostgresServer, encoded: bytes, why: str
) -> None:
    async with fresh_postgres_store(postgres_server, judged_by="client") as store:
        await store.claim(_claim())
        done = Completion("k", "a", NOW, 3600.0, "v", encoded, None)
        assert await store.complete(done) is Written.WITHOUT_RESPONSE
        record = (await store.get("k", now=NOW)).record
        assert record is not None and record.status is Status.COMPLETED
        assert record.response_stored is False
        assert record.not_stored is not None and why in record.not_stored


async def test_an_escaped_backslash_before_u0000_is_ordinary_text(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server, judged_by="client") as store:
        await store.claim(_claim())
        assert await store.complete(_done("k", "\\u0000")) is Written.RESPONSE
        record = (await store.get("k", now=NOW)).record
        assert record is not None and record.response == "\\u0000"


async def test_a_response_over_max_response_bytes_completes_without_it(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(
        postgres_server, judged_by="client", max_response_bytes=100
    ) as store:
        await store.claim(_claim())
        assert await store.complete(_done("k", "x" * 200)) is Written.WITHOUT_RESPONSE
        record = (await store.get("k", now=NOW)).record
        assert record is not None and record.response_stored is False
        assert "max_response_bytes" in (record.not_stored or "")


async def _sql(server: PostgresServer, *statements: str) -> None:
    connection = await server.connect()
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def test_a_claim_racing_an_uncommitted_insert_answers_with_the_committed_row(
    postgres_server: PostgresServer,
) -> None:
    # The row is committed after the claim's snapshot: the claim waits on its lock, then
    # answers with it (the snapshot alone would have seen no row).
    async with fresh_postgres_store(postgres_server) as store:
        other = await postgres_server.connect()
        try:
            transaction = other.transaction()
            await transaction.start()
            await other.execute(
                f"INSERT INTO {store.table} VALUES ('k', 'INPROGRESS', 'other', "
                "clock_timestamp() + interval '1 hour', clock_timestamp() + interval '60 s', "
                "NULL, NULL, NULL)"
            )
            claim = asyncio.create_task(store.claim(_claim(owner="b", now=0)))
            await asyncio.sleep(0.3)
            assert not claim.done()  # waiting for the other transaction's row
            await transaction.commit()
            verdict = await claim
        finally:
            await other.close()
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.record is not None and verdict.record.owner == "other"
        assert verdict.retry_after is not None and 50 < verdict.retry_after <= 60


async def test_a_claim_racing_a_completion_replays_it(postgres_server: PostgresServer) -> None:
    # The claim's snapshot holds a lapsed claim; the latest version, committed while the
    # claim waited for its lock, is completed: the duplicate replays it (never claims, never
    # "in progress").
    async with fresh_postgres_store(postgres_server) as store:
        other = await postgres_server.connect()
        try:
            await other.execute(
                f"INSERT INTO {store.table} VALUES ('k', 'INPROGRESS', 'a', "
                "clock_timestamp() + interval '1 hour', clock_timestamp() - interval '1 s', "
                "'v', NULL, NULL)"
            )
            transaction = other.transaction()
            await transaction.start()
            await other.execute(
                f"UPDATE {store.table} SET status = 'COMPLETED', lease_ends_at = NULL, "
                "response = '{\"paid\": true}' WHERE key = 'k'"
            )
            claim = asyncio.create_task(store.claim(_claim(owner="b", now=0)))
            await asyncio.sleep(0.3)
            assert not claim.done()
            await transaction.commit()
            verdict = await claim
        finally:
            await other.close()
        assert verdict.found is Found.COMPLETED
        assert verdict.record is not None and verdict.record.response == {"paid": True}
        record = (await store.get("k", now=0)).record
        assert record is not None and record.owner == "a" and record.response == {"paid": True}


async def test_a_refused_claim_writes_nothing(postgres_server: PostgresServer) -> None:
    async with fresh_postgres_store(postgres_server) as store:
        await store.claim(_claim(now=0))
        await store.complete(_done("k", 1))
        other = await postgres_server.connect()
        try:
            before = await other.fetchval(f"SELECT ctid::text FROM {store.table}")
            for _ in range(3):
                assert (await store.claim(_claim(owner="b", now=0))).found is Found.COMPLETED
            # The same row version: no rewrite, no lock (a replay is a read).
            assert await other.fetchval(f"SELECT ctid::text FROM {store.table}") == before
            assert await other.fetchval(f"SELECT xmax::text FROM {store.table}") == "0"
        finally:
            await other.close()


async def test_a_stored_response_nested_too_deep_answers_not_stored(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server, judged_by="client") as store:
        deep = "[" * 600 + "]" * 600
        await _sql(
            postgres_server,
            f"INSERT INTO {store.table} VALUES ('k', 'COMPLETED', 'x', "
            f"to_timestamp({NOW + 60}), NULL, NULL, '{deep}', NULL)",
        )
        verdict = await store.claim(_claim(owner="b"))
        assert verdict.found is Found.COMPLETED
        assert verdict.record is not None and verdict.record.response_stored is False
        assert "nested" in (verdict.record.not_stored or "")


async def test_a_row_with_an_unknown_status_is_inconsistent_state(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server, judged_by="client") as store:
        table = store.table
        await _sql(
            postgres_server,
            f"ALTER TABLE {table} DROP CONSTRAINT {table}_status_check",
            f"INSERT INTO {table} VALUES ('k', 'WEIRD', 'x', to_timestamp({NOW + 60}), "
            "NULL, NULL, NULL, NULL)",
        )
        with pytest.raises(errors.InconsistentStateError, match="delete it"):
            await store.claim(_claim(owner="b"))
        with pytest.raises(errors.InconsistentStateError):
            await store.get("k", now=NOW)
        # The operator's way out: delete it.
        with pytest.raises(errors.InconsistentStateError):
            await store.force_release("k")
        assert (await store.get("k", now=NOW)).record is None


async def test_vacuum_deletes_expired_rows_in_bounded_batches(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server) as store:
        past = time.time() - 7200  # expired by the server's clock an hour ago
        table = store.table
        await _sql(
            postgres_server,
            f"INSERT INTO {table} SELECT 'old' || i, 'COMPLETED', 'x', "
            f"to_timestamp({past}), NULL, NULL, '1', NULL FROM generate_series(1, 25) i",
        )
        assert await store.claim(_claim("live", now=0)) is CLAIMED
        assert await store.vacuum(batch_size=10, max_batches=2) == 20
        assert await store.vacuum(batch_size=10) == 5
        assert await store.vacuum() == 0
        assert (await store.get("live", now=0)).found is Found.IN_PROGRESS


async def test_create_table_is_idempotent_and_prints_the_same_sql(
    postgres_server: PostgresServer,
) -> None:
    table = fresh_table_name()
    await create_table(postgres_server.dsn, table=table)
    await create_table(postgres_server.dsn, table=table)
    copy = f"{table}_copy"
    sql = table_sql(copy)
    assert f'CREATE TABLE IF NOT EXISTS "{copy}"' in sql
    assert "CREATE CONSTRAINT TRIGGER idempotency_async_unfinished" in sql
    assert f"schema {SCHEMA_VERSION}'" in sql
    await _sql(postgres_server, sql)  # what a migration tool would run
    pool = await postgres_server.pool()
    try:
        store = PostgresStore(pool, table=copy)
        assert await store.claim(_claim(now=0)) is CLAIMED
        async with pool.acquire() as conn, conn.transaction():
            assert (await store.transaction_store(conn)).table == copy  # the guard is there
    finally:
        await pool.close()


async def test_a_pool_with_its_own_jsonb_codec_stores_responses_unchanged(
    postgres_server: PostgresServer,
) -> None:
    async def codec(connection: Any) -> None:
        # What many applications set up: jsonb to and from Python objects.
        await connection.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )

    table = fresh_table_name()
    await create_table(postgres_server.dsn, table=table)
    pool = await postgres_server.pool(init=codec)
    try:
        store = PostgresStore(pool, table=table)
        await store.claim(_claim(now=0))
        assert await store.complete(_done("k", {"a": [1, 2**70]})) is Written.RESPONSE
        record = (await store.get("k", now=0)).record
        assert record is not None and record.response == {"a": [1, 2**70]}
        assert await pool.fetchval(f"SELECT response FROM {table}") == {"a": [1, 2**70]}
    finally:
        await pool.close()


def test_table_names_are_checked_before_any_sql() -> None:
    for bad in ["", "a;drop table x", 'a"b', "a.b.c", "1abc"]:
        with pytest.raises(errors.ConfigError, match="table name"):
            table_sql(bad)
    assert '"audit"."records"' in table_sql("audit.records")


async def test_a_missing_table_says_how_to_create_it(postgres_server: PostgresServer) -> None:
    async with PostgresStore.from_url(postgres_server.dsn, table=fresh_table_name()) as store:
        with pytest.raises(errors.StoreValidationError, match="create-table"):
            await store.claim(_claim())


async def test_an_unreachable_server_is_store_unavailable() -> None:
    store = PostgresStore.from_url(
        "postgres://postgres@127.0.0.1:1/postgres", pool_options={"timeout": 2}
    )
    try:
        with pytest.raises(errors.StoreUnavailableError):
            await store.claim(_claim())
    finally:
        await store.aclose()


async def test_an_owned_pool_closes_with_the_store_and_a_callers_pool_does_not(
    postgres_server: PostgresServer,
) -> None:
    table = fresh_table_name()
    await create_table(postgres_server.dsn, table=table)
    owned = PostgresStore.from_url(postgres_server.dsn, table=table)
    assert await owned.claim(_claim(now=0)) is CLAIMED
    await owned.aclose()
    with pytest.raises(errors.ConfigError, match="closed"):
        await owned.get("k", now=0)
    pool = await postgres_server.pool()
    try:
        async with PostgresStore(pool, table=table) as store:
            assert (await store.get("k", now=0)).found is Found.IN_PROGRESS
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


def test_a_wrong_dsn_is_refused_without_echoing_its_password() -> None:
    for call in (
        lambda: PostgresStore.from_url("mysql://user:s3cret@db/app"),
        lambda: asyncio.run(create_table("mysql://user:s3cret@db/app")),
    ):
        with pytest.raises(errors.ConfigError, match="postgres://") as refused:
            call()
        assert "s3cret" not in str(refused.value)


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(errors.ConfigError, match="postgres://"):
        PostgresStore.from_url("redis://localhost")
    with pytest.raises(errors.ConfigError, match="pool"):
        PostgresStore(object())
    with pytest.raises(errors.ConfigError, match="judged_by"):
        PostgresStore.from_url("postgres://x/y", judged_by="local")  # type: ignore[arg-type]


async def test_a_single_connection_is_refused(postgres_server: PostgresServer) -> None:
    connection = await postgres_server.connect()
    try:
        with pytest.raises(errors.ConfigError, match="single connection"):
            PostgresStore(connection)
    finally:
        await connection.close()


async def test_works_without_named_prepared_statements_as_behind_pgbouncer(
    postgres_server: PostgresServer,
) -> None:
    table = fresh_table_name()
    await create_table(postgres_server.dsn, table=table)
    options = {"statement_cache_size": 0}
    async with PostgresStore.from_url(
        postgres_server.dsn, table=table, pool_options=options
    ) as store:
        verdicts = await asyncio.gather(*(store.claim(_claim(owner=f"o{n}")) for n in range(10)))
        assert sum(verdict is CLAIMED for verdict in verdicts) == 1
        owner = next(verdict.record.owner for verdict in verdicts if verdict.record is not None)
        assert await store.complete(_done("k", {"big": 2**70}, owner=owner)) is Written.RESPONSE
        record = (await store.get("k", now=0)).record
        assert record is not None and record.response == {"big": 2**70}


async def test_expiry_is_whole_seconds_after_the_server_now(
    postgres_server: PostgresServer,
) -> None:
    async with fresh_postgres_store(postgres_server) as store:
        before = time.time()
        await store.claim(Claim("k", "a", 0, 1.0, 10.0, None))
        record = (await store.get("k", now=0)).record
        assert record is not None
        assert record.expiration == math.ceil(record.expiration)
        assert before + 9 < record.expiration <= time.time() + 11


class TestPsycopgPool(StoreContract):
    """The store on psycopg 3's AsyncConnectionPool: the same contract, one adapter."""

    @pytest.fixture
    async def store(self, postgres_server: PostgresServer) -> AsyncIterator[PostgresStore]:
        psycopg_pool = pytest.importorskip("psycopg_pool")
        pool = psycopg_pool.AsyncConnectionPool(
            postgres_server.dsn, kwargs={"autocommit": True}, min_size=1, max_size=4, open=False
        )
        await pool.open()
        try:
            table = fresh_table_name()
            await create_table(pool, table=table)
            yield PostgresStore(pool, table=table, judged_by="client")
        finally:
            await pool.close()


async def test_a_psycopg_pool_outside_autocommit_is_refused(
    postgres_server: PostgresServer,
) -> None:
    psycopg_pool = pytest.importorskip("psycopg_pool")
    pool = psycopg_pool.AsyncConnectionPool(postgres_server.dsn, min_size=1, open=False)
    await pool.open()
    try:
        with pytest.raises(errors.ConfigError, match="autocommit"):
            await PostgresStore(pool, table=fresh_table_name()).claim(_claim())
    finally:
        await pool.close()


async def test_psycopg_failures_are_translated(postgres_server: PostgresServer) -> None:
    psycopg_pool = pytest.importorskip("psycopg_pool")
    pool = psycopg_pool.AsyncConnectionPool(
        postgres_server.dsn, kwargs={"autocommit": True}, min_size=1, open=False
    )
    await pool.open()
    try:
        with pytest.raises(errors.StoreValidationError, match="create-table"):
            await PostgresStore(pool, table=fresh_table_name()).claim(_claim())
    finally:
        await pool.close()
