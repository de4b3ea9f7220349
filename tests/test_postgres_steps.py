"""Recovery points on PostgresStore (schema version 3), against a real postgres, on both
drivers: the claim keeps, drops or refuses a row's steps; ``extend`` keeps them,
``complete`` drops them, ``release`` keeps them in the released state; ``record_step`` is
one owner-fenced ``UPDATE``; the transactional claim function follows the same rule; a
table at schema version 2 migrates to 3 with its records; and calls through a Manager
resume after a failure.  (The shared StepsContract runs on every store; this pins the
SQL.)"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options, errors, step
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import (
    CLAIMED,
    Extended,
    Found,
    RecordsSteps,
    Stepped,
    StepWrite,
    Written,
)
from idempotency_async.stores.postgres import (
    PostgresStore,
    create_table,
    migrate_table,
    migration_sql,
)

pytestmark = pytest.mark.postgres

NOW = 1_700_000_000.0
TTL = 3600.0
ONE = '[["one",1]]'
TWO = '[["one",1],["two",{"b":2,"a":[1.5e300,"\\u0000"]}]]'


class Setup:
    """A store on one driver, and an asyncpg pool to look at its table."""

    def __init__(self, store: PostgresStore, pool: Any, table: str) -> None:
        self.store = store
        self.pool = pool
        self.table = table

    async def row(self, key: str = "k") -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            f"""SELECT status, owner, validation, steps, step_count,
                extract(epoch FROM expires_at)::float8 AS expires,
                extract(epoch FROM lease_ends_at)::float8 AS lease_end
            FROM {self.table} WHERE key = $1""",
            key,
        )
        return None if row is None else dict(row)


@pytest.fixture(params=["asyncpg", "psycopg"])
async def setup(request: Any, postgres_server: PostgresServer) -> AsyncIterator[Setup]:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    await create_table(pool, table=table)
    try:
        if request.param == "asyncpg":
            yield Setup(PostgresStore(pool, table=table, judged_by="client"), pool, table)
            return
        psycopg_pool = pytest.importorskip("psycopg_pool")
        driven = psycopg_pool.AsyncConnectionPool(
            postgres_server.dsn, kwargs={"autocommit": True}, min_size=1, max_size=4, open=False
        )
        await driven.open()
        try:
            yield Setup(PostgresStore(driven, table=table, judged_by="client"), pool, table)
        finally:
            await driven.close()
    finally:
        await pool.close()


def claim(
    owner: str = "a",
    *,
    now: float = NOW,
    lease: float = 30.0,
    ttl: float = TTL,
    validation: str | None = "v",
    key: str = "k",
) -> Claim:
    return Claim(key, owner, now, lease, ttl, validation)


def write(
    steps: str,
    position: int,
    owner: str = "a",
    *,
    now: float = NOW + 1,
    ttl: float = TTL,
    key: str = "k",
) -> StepWrite:
    return StepWrite(key, owner, now, ttl, position, steps)


async def two_steps(store: PostgresStore, **options: Any) -> None:
    """Claim ``k`` as ``a`` (validation ``v``) at NOW and record two steps."""
    key = options.get("key", "k")
    assert await store.claim(claim(**options)) is CLAIMED
    assert await store.record_step(write(ONE, 0, key=key)) is Stepped.RECORDED
    assert await store.record_step(write(TWO, 1, key=key)) is Stepped.RECORDED


# -- record_step ----------------------------------------------------------------------


async def test_the_store_has_the_capability(setup: Setup) -> None:
    assert isinstance(setup.store, RecordsSteps)


async def test_a_step_is_written_at_its_position_and_its_text_kept_exactly(
    setup: Setup,
) -> None:
    store = setup.store
    await two_steps(store)
    row = await setup.row()
    assert row is not None
    # text, not jsonb: the manager's JSON byte for byte (member order, exponent, \u0000).
    assert row["steps"] == TWO and row["step_count"] == 2
    # Sent again (its answer lost): recorded, nothing changes.
    assert await store.record_step(write(TWO, 1)) is Stepped.RECORDED
    assert (await setup.row()) == row
    # Another list at a position the record has passed, or one it has not reached: lost.
    assert await store.record_step(write('[["x",1]]', 0)) is Stepped.LOST
    assert await store.record_step(write(TWO[:-1] + ',["z",3]]', 3)) is Stepped.LOST
    assert (await setup.row()) == row


async def test_a_step_write_is_fenced_by_owner_and_status(setup: Setup) -> None:
    store = setup.store
    assert await store.claim(claim()) is CLAIMED
    assert await store.record_step(write(ONE, 0, owner="b")) is Stepped.LOST
    assert await store.record_step(write(ONE, 0, key="absent")) is Stepped.LOST
    done = Completion("k", "a", NOW + 1, TTL, "v", b"1", 1)
    assert await store.complete(done) is Written.RESPONSE
    assert await store.record_step(write(ONE, 0)) is Stepped.LOST
    row = await setup.row()
    assert row is not None and row["status"] == "COMPLETED" and row["steps"] is None


async def test_a_step_list_beyond_max_response_bytes_is_too_large_and_not_sent(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    try:
        await create_table(pool, table=table)
        store = PostgresStore(pool, table=table, judged_by="client", max_response_bytes=20)
        assert await store.claim(claim()) is CLAIMED
        fits = '[["n","' + "x" * 10 + '"]]'
        assert len(fits) == 20
        assert await store.record_step(write(fits, 0)) is Stepped.RECORDED
        # 21 bytes of UTF-8 in 20 characters: counted in bytes.
        over = '[["n","' + "x" * 9 + 'é"]]'
        assert len(over) == 20
        assert await store.record_step(write(over, 1)) is Stepped.TOO_LARGE
        row = await pool.fetchrow(f"SELECT steps, step_count FROM {table}")
        assert tuple(row) == (fits, 1)
    finally:
        await pool.close()


async def test_a_step_moves_the_expiry_forward_never_back_never_before_the_lease_end(
    setup: Setup,
) -> None:
    store = setup.store
    assert await store.claim(claim(lease=30, ttl=100)) is CLAIMED
    before = await setup.row()
    assert before is not None and before["expires"] == NOW + 100
    # Later: the expiry moves to ceil(now + ttl); the lease end stays.
    assert await store.record_step(write(ONE, 0, now=NOW + 50.5, ttl=100)) is Stepped.RECORDED
    row = await setup.row()
    assert row is not None
    assert row["expires"] == math.ceil(NOW + 150.5) and row["lease_end"] == before["lease_end"]
    # A shorter ttl never moves it back.
    assert await store.record_step(write(TWO, 1, now=NOW + 60, ttl=5)) is Stepped.RECORDED
    again = await setup.row()
    assert again is not None and again["expires"] == row["expires"]
    # Never before the lease end (a ttl shorter than the lease).
    other = claim(key="short", lease=300, ttl=10)
    assert await store.claim(other) is CLAIMED
    assert await store.record_step(write(ONE, 0, key="short", ttl=1)) is Stepped.RECORDED
    short = await setup.row("short")
    assert short is not None and short["expires"] >= short["lease_end"] == NOW + 300


# -- extend, complete, release -------------------------------------------------------------


async def test_extend_keeps_the_steps(setup: Setup) -> None:
    await two_steps(setup.store)
    assert await setup.store.extend(claim(now=NOW + 10, lease=60)) is Extended.RENEWED
    row = await setup.row()
    assert row is not None and row["steps"] == TWO and row["step_count"] == 2
    assert row["lease_end"] == NOW + 70


async def test_complete_drops_the_steps(setup: Setup) -> None:
    await two_steps(setup.store)
    done = Completion("k", "a", NOW + 2, TTL, "v", b'{"r":1}', {"r": 1})
    assert await setup.store.complete(done) is Written.RESPONSE
    row = await setup.row()
    assert row is not None and row["status"] == "COMPLETED"
    assert row["steps"] is None and row["step_count"] is None
    verdict = await setup.store.get("k", now=NOW + 3)
    assert verdict.found is Found.COMPLETED and verdict.record is not None
    assert verdict.record.steps is None and verdict.record.response == {"r": 1}


async def test_release_keeps_the_steps_in_the_released_state(setup: Setup) -> None:
    store = setup.store
    await two_steps(store)
    before = await setup.row()
    assert before is not None
    assert await store.release("k", "a") is True
    row = await setup.row()
    assert row is not None
    assert row["status"] == "INPROGRESS" and row["owner"] is None
    assert row["steps"] == TWO and row["step_count"] == 2
    assert row["validation"] == "v" and row["expires"] == before["expires"]
    assert row["lease_end"] < NOW  # ended: long past on the manager's clock
    verdict = await store.get("k", now=NOW + 2)
    assert verdict.found is Found.CLAIMABLE and verdict.record is not None
    assert verdict.record.steps == TWO and verdict.record.owner is None
    # A release meeting the ownerless record (sent again, or by another): True, kept.
    assert await store.release("k", "a") is True
    assert await store.release("k", "b") is True
    assert (await setup.row()) == row
    # Another owner's live record is not released.
    assert await store.claim(claim("c", now=NOW + 3)) is not None
    assert await store.release("k", "b") is False


async def test_release_by_the_server_clock_ends_the_lease_a_millisecond_ago(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    try:
        await create_table(pool, table=table)
        store = PostgresStore(pool, table=table)
        assert await store.claim(claim()) is CLAIMED
        assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
        assert await store.release("k", "a") is True
        ago = await pool.fetchval(
            f"SELECT extract(epoch FROM clock_timestamp() - lease_ends_at) FROM {table}"
        )
        assert 0.001 <= float(ago) < 5
        # Claimable at once, by its own payload, with its steps.
        verdict = await store.claim(claim("b"))
        assert verdict.found is Found.CLAIMED and verdict.record is not None
        assert verdict.record.steps == ONE
    finally:
        await pool.close()


async def test_release_without_steps_deletes_the_row(setup: Setup) -> None:
    store = setup.store
    assert await store.claim(claim()) is CLAIMED
    assert await store.release("k", "a") is True
    assert await setup.row() is None
    assert await store.release("k", "a") is True  # gone counts as released


async def test_force_release_removes_the_steps(setup: Setup) -> None:
    await two_steps(setup.store)
    removed = await setup.store.force_release("k")
    assert removed is not None and removed.steps == TWO
    assert await setup.row() is None


async def test_an_operators_exact_release_removes_only_the_progress_it_was_shown(
    setup: Setup,
) -> None:
    store = setup.store
    assert await store.claim(claim()) is CLAIMED
    assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
    shown = (await store.get("k", now=NOW + 1)).record
    assert shown is not None and shown.steps == ONE
    assert await store.record_step(write(TWO, 1)) is Stepped.RECORDED
    assert await store.release_exactly(shown) is False
    assert await setup.row() is not None
    now_shown = (await store.get("k", now=NOW + 1)).record
    assert now_shown is not None
    assert await store.release_exactly(now_shown) is True
    assert await setup.row() is None


# -- claims ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["lapsed", "released", "own"])
async def test_a_claim_keeps_the_steps_of_an_unexpired_row_with_its_validation(
    setup: Setup, how: str
) -> None:
    store = setup.store
    await two_steps(store, lease=10)
    if how == "released":
        assert await store.release("k", "a") is True
    later = NOW + 20 if how == "lapsed" else NOW + 2
    owner = "a" if how == "own" else "b"
    verdict = await store.claim(claim(owner, now=later, lease=30))
    # One round trip: the claim's answer carries the kept steps.
    assert verdict.found is Found.CLAIMED and verdict is not CLAIMED
    record = verdict.record
    assert record is not None and record.steps == TWO and record.owner == owner
    assert record.status is Status.INPROGRESS and record.lease_end == later + 30
    row = await setup.row()
    assert row is not None and row["owner"] == owner and row["step_count"] == 2
    # The new holder goes on from step 3.
    three = TWO[:-1] + ',["three",3]]'
    assert await store.record_step(write(three, 2, owner, now=later)) is Stepped.RECORDED


async def test_none_validation_equals_none(setup: Setup) -> None:
    store = setup.store
    await two_steps(store, validation=None)
    verdict = await store.claim(claim("b", now=NOW + 40, validation=None))
    assert verdict.found is Found.CLAIMED and verdict.record is not None
    assert verdict.record.steps == TWO
    refused = await store.claim(claim("c", now=NOW + 50, validation="v"))
    assert refused.found is Found.IN_PROGRESS  # b holds it now


@pytest.mark.parametrize("how", ["lapsed", "released"])
async def test_another_validation_is_refused_as_resumable_and_nothing_written(
    setup: Setup, how: str
) -> None:
    store = setup.store
    await two_steps(store, lease=10)
    if how == "released":
        assert await store.release("k", "a") is True
    before = await setup.row()
    verdict = await store.claim(claim("b", now=NOW + 20, validation="other"))
    assert verdict.found is Found.RESUMABLE
    assert verdict.record is not None and verdict.record.steps == TWO
    assert verdict.record.validation == "v"
    assert (await setup.row()) == before
    # Also with no validation at all against one.
    none = await store.claim(claim("b", now=NOW + 20, validation=None))
    assert none.found is Found.RESUMABLE
    # And the held record is still in progress for another validation (not resumable).
    assert await store.claim(claim("c", now=NOW + 21)) is not CLAIMED


async def test_an_expired_rows_steps_are_dropped(setup: Setup) -> None:
    store = setup.store
    await two_steps(store, lease=10, ttl=60)
    expired = NOW + 2 * TTL
    # Whatever the validation: the progress is gone with the record.
    assert await store.claim(claim("b", now=expired, validation="other")) is CLAIMED
    row = await setup.row()
    assert row is not None and row["owner"] == "b" and row["validation"] == "other"
    assert row["steps"] is None and row["step_count"] is None
    assert await store.record_step(write(ONE, 0, "b", now=expired)) is Stepped.RECORDED


async def test_a_claim_without_steps_answers_the_shared_constant(setup: Setup) -> None:
    store = setup.store
    assert await store.claim(claim()) is CLAIMED
    assert await store.claim(claim()) is CLAIMED  # sent again
    assert await store.claim(claim("b", now=NOW + 40)) is CLAIMED  # a lapsed one
    held = await store.claim(claim("c", now=NOW + 41))
    assert held.found is Found.IN_PROGRESS and held.record is not None
    assert held.record.steps is None


async def test_a_live_holder_with_steps_is_in_progress_for_everyone(setup: Setup) -> None:
    store = setup.store
    await two_steps(store)
    for validation in ("v", "other"):
        verdict = await store.claim(claim("b", now=NOW + 2, validation=validation))
        assert verdict.found is Found.IN_PROGRESS and verdict.record is not None
        assert verdict.record.steps == TWO


async def test_a_step_list_longer_than_the_bound_is_read_back_cut(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    try:
        await create_table(pool, table=table)
        store = PostgresStore(pool, table=table, judged_by="client", max_response_bytes=10)
        assert await store.claim(claim()) is CLAIMED
        # Another writer's list, far beyond what the store accepts: read back bounded.
        await pool.execute(f"UPDATE {table} SET steps = repeat('x', 1000000), step_count = 1")
        verdict = await store.get("k", now=NOW + 1)
        assert verdict.record is not None and verdict.record.steps is not None
        assert 40 < len(verdict.record.steps) < 2000
    finally:
        await pool.close()


# -- through a Manager ----------------------------------------------------------------------


class Flaky:
    """A three-step call that fails after ``fail_after`` steps, counting each step's runs."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.fail_after: int | None = None

    def effect(self, name: str, value: Any) -> Any:
        async def run() -> Any:
            self.runs[name] = self.runs.get(name, 0) + 1
            return value

        return run

    async def __call__(self) -> dict[str, Any]:
        results = []
        for n, name in enumerate(("one", "two", "three"), start=1):
            results.append(await step(name, self.effect(name, {"n": n})))
            if self.fail_after == n:
                raise RuntimeError(f"crashed after step {n}")
        return {"results": results}


def manager(store: PostgresStore, **options: Any) -> Manager:
    options.setdefault("key_prefix", "steps")
    options.setdefault("event_key_jmespath", "id")
    options.setdefault("payload_validation_jmespath", "body")
    return Manager(store, Options(**options))


@pytest.mark.parametrize("fail_after", [1, 2])
async def test_a_call_failing_after_step_k_resumes_at_step_k_plus_one(
    setup: Setup, fail_after: int
) -> None:
    calls = manager(setup.store, clock=lambda: NOW)
    work = Flaky()
    work.fail_after = fail_after
    payload = {"id": "order", "body": 1}
    with pytest.raises(RuntimeError, match=f"after step {fail_after}"):
        await calls.execute(payload, work, timeout=30)
    key = calls.key_for(payload)
    row = await setup.row(key)
    assert row is not None and row["owner"] is None and row["step_count"] == fail_after
    work.fail_after = None
    result = await calls.execute(payload, work, timeout=30)
    assert result == {"results": [{"n": 1}, {"n": 2}, {"n": 3}]}
    assert work.runs == {"one": 1, "two": 1, "three": 1}
    row = await setup.row(key)
    assert row is not None and row["status"] == "COMPLETED" and row["steps"] is None
    # Completed: replayed, nothing runs.
    assert await calls.execute(payload, work, timeout=30) == result
    assert work.runs == {"one": 1, "two": 1, "three": 1}


async def test_a_crashed_holders_steps_resume_after_its_lease(setup: Setup) -> None:
    clock = [NOW]
    calls = manager(setup.store, clock=lambda: clock[0])
    work = Flaky()
    work.fail_after = 2
    payload = {"id": "order", "body": 1}
    key = calls.key_for(payload)
    with pytest.raises(RuntimeError):
        await calls.execute(payload, work, timeout=30)
    # As if its process had died after step 2: the owner's record, its lease running.
    await setup.pool.execute(
        f"UPDATE {setup.table} SET owner = 'dead', lease_ends_at = to_timestamp($2::float8) "
        "WHERE key = $1",
        key,
        NOW + 30,
    )
    work.fail_after = None
    clock[0] = NOW + 10
    with pytest.raises(errors.AlreadyInProgressError):
        await calls.execute(payload, work, timeout=30)
    clock[0] = NOW + 31  # its lease ended
    result = await calls.execute(payload, work, timeout=30)
    assert result == {"results": [{"n": 1}, {"n": 2}, {"n": 3}]}
    assert work.runs == {"one": 1, "two": 1, "three": 1}


async def test_a_kept_step_list_that_cannot_be_read_runs_nothing(setup: Setup) -> None:
    calls = manager(setup.store, clock=lambda: NOW)
    work = Flaky()
    work.fail_after = 1
    payload = {"id": "order", "body": 1}
    with pytest.raises(RuntimeError):
        await calls.execute(payload, work, timeout=30)
    key = calls.key_for(payload)
    # Another writer damaged the list (still this payload's, still released).
    await setup.pool.execute(
        f'UPDATE {setup.table} SET steps = \'{{"not": "a list"}}\' WHERE key = $1', key
    )
    work.fail_after = None
    with pytest.raises(errors.InconsistentStateError, match="recovery points"):
        await calls.execute(payload, work, timeout=30)
    assert work.runs == {"one": 1}


async def test_another_payload_on_a_key_with_progress_is_refused(setup: Setup) -> None:
    calls = manager(setup.store, clock=lambda: NOW)
    work = Flaky()
    work.fail_after = 1
    with pytest.raises(RuntimeError):
        await calls.execute({"id": "order", "body": 1}, work, timeout=30)
    work.fail_after = None
    with pytest.raises(errors.PayloadValidationError):
        await calls.execute({"id": "order", "body": 2}, work, timeout=30)
    assert work.runs == {"one": 1}


async def test_an_expired_records_progress_is_dropped_and_every_step_runs_again(
    setup: Setup,
) -> None:
    clock = [NOW]
    calls = manager(setup.store, clock=lambda: clock[0], expires_after=60)
    work = Flaky()
    work.fail_after = 2
    payload = {"id": "order", "body": 1}
    with pytest.raises(RuntimeError):
        await calls.execute(payload, work, timeout=30)
    clock[0] = NOW + 3600
    work.fail_after = None
    await calls.execute(payload, work, timeout=30)
    assert work.runs == {"one": 2, "two": 2, "three": 1}


# -- transactional calls meeting steps ---------------------------------------------------


async def test_the_transactional_claim_keeps_drops_and_refuses_as_the_lease_claim(
    setup: Setup,
) -> None:
    store, pool = setup.store, setup.pool
    await two_steps(store, key="keep")
    await two_steps(store, key="refuse")
    await two_steps(store, key="drop")
    await pool.execute(
        f"UPDATE {setup.table} SET expires_at = clock_timestamp() - interval '1 s', "
        "lease_ends_at = clock_timestamp() - interval '2 s' WHERE key = 'drop'"
    )
    await pool.execute(
        f"UPDATE {setup.table} SET lease_ends_at = clock_timestamp() - interval '1 s', "
        "expires_at = clock_timestamp() + interval '1 h'"
        " WHERE key IN ('keep', 'refuse')"
    )
    async with pool.acquire() as conn, conn.transaction():
        tx = await store.transaction_store(conn)
        kept = await tx.claim(Claim("keep", "t1", NOW, 30, TTL, "v"))
        assert kept.found is Found.CLAIMED and kept.record is not None
        assert kept.record.steps == TWO
        refused = await tx.claim(Claim("refuse", "t2", NOW, 30, TTL, "other"))
        assert refused.found is Found.RESUMABLE and refused.record is not None
        assert refused.record.steps == TWO
        assert await tx.claim(Claim("drop", "t3", NOW, 30, TTL, "other")) is CLAIMED
        for key in ("keep", "drop"):
            await tx.complete(
                Completion(key, "t1" if key == "keep" else "t3", NOW, TTL, "v", b"1", 1)
            )
    rows = {key: await setup.row(key) for key in ("keep", "refuse", "drop")}
    assert rows["keep"] is not None and rows["keep"]["status"] == "COMPLETED"
    assert rows["keep"]["steps"] is None and rows["keep"]["step_count"] is None
    assert rows["drop"] is not None and rows["drop"]["steps"] is None
    assert rows["refuse"] is not None and rows["refuse"]["owner"] == "a"
    assert rows["refuse"]["steps"] == TWO


async def test_a_failed_transactional_call_releases_the_steps_it_took_over(
    setup: Setup,
) -> None:
    store, pool = setup.store, setup.pool
    calls = manager(store)
    payload = {"id": "order", "body": 1}
    key = calls.key_for(payload)
    lease = Manager(
        store,
        Options(
            key_prefix="steps",
            event_key_jmespath="id",
            payload_validation_jmespath="body",
            lease=0.5,
        ),
    )
    work = Flaky()
    work.fail_after = 1
    with pytest.raises(RuntimeError):
        await lease.execute(payload, work, timeout=30)
    assert (await setup.row(key) or {}).get("step_count") == 1
    work.fail_after = 2
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(RuntimeError, match="after step 2"):
            await calls.execute_in_transaction(conn, payload, work, timeout=30)
    # Step one replayed in the transaction; step two ran (unrecorded: its writes would
    # roll back with the call's savepoint); the progress is released, kept.
    assert work.runs == {"one": 1, "two": 1}
    row = await setup.row(key)
    assert row is not None and row["owner"] is None and row["status"] == "INPROGRESS"
    assert row["step_count"] == 1
    work.fail_after = None
    await asyncio.sleep(0)
    result = await lease.execute(payload, work, timeout=30)
    assert result["results"][0] == {"n": 1}
    assert work.runs == {"one": 1, "two": 2, "three": 1}


# -- migration -------------------------------------------------------------------------------


async def test_migration_from_schema_2_keeps_the_records_and_rewrites_nothing(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    try:
        # A table at schema version 2: without the step columns and version 3's claim and
        # step functions.
        await create_table(pool, table=table)
        await pool.execute(f"ALTER TABLE {table} DROP COLUMN steps, DROP COLUMN step_count")
        await pool.execute(f"DROP FUNCTION {_function(table, 'claim')}")
        await pool.execute(f"DROP FUNCTION {_function(table, 'step')}")
        await pool.execute(f"COMMENT ON TABLE {table} IS 'idempotency-async records, schema 2'")
        await pool.execute(
            f"INSERT INTO {table} (key, status, owner, expires_at, lease_ends_at, "
            "validation, response) VALUES "
            "('done', 'COMPLETED', 'x', clock_timestamp() + interval '1 h', NULL, 'v', "
            "'{\"r\": 1}'), "
            "('held', 'INPROGRESS', 'y', clock_timestamp() + interval '1 h', "
            "clock_timestamp() + interval '1 h', 'v', NULL)"
        )
        store = PostgresStore(pool, table=table)
        with pytest.raises(errors.StoreValidationError, match="idempotency-async migrate"):
            await store.claim(claim("z", key="done"))
        assert "ADD COLUMN IF NOT EXISTS steps text" in migration_sql(table)
        node = await pool.fetchval("SELECT pg_relation_filenode($1::regclass)", table)
        await migrate_table(pool, table=table)
        await migrate_table(pool, table=table)  # idempotent
        # ADD COLUMN … NULL without a default: the catalog only, the rows not rewritten.
        assert await pool.fetchval("SELECT pg_relation_filenode($1::regclass)", table) == node
        done = await store.claim(claim("z", key="done"))
        assert done.found is Found.COMPLETED and done.record is not None
        assert done.record.response == {"r": 1}
        held = await store.claim(claim("z", key="held"))
        assert held.found is Found.IN_PROGRESS and held.record is not None
        assert held.record.steps is None
        assert await store.claim(claim()) is CLAIMED
        assert await store.record_step(write(ONE, 0)) is Stepped.RECORDED
        comment = await pool.fetchval("SELECT obj_description($1::regclass)", table)
        assert comment == "idempotency-async records, schema 3"
        # Transactional calls and steps work on it.
        calls = manager(store)
        async with pool.acquire() as conn:
            async with conn.transaction():
                assert await calls.execute_in_transaction(conn, {"id": "t", "body": 1}, _one) == 1

            async def stepped() -> int:
                return await step("one", _one, connection=conn)

            assert await calls.execute({"id": "s", "body": 1}, stepped, timeout=30) == 1
    finally:
        await pool.close()


async def test_a_transactional_call_on_a_schema_2_table_asks_for_the_migration(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    try:
        await create_table(pool, table=table)
        await pool.execute(f"DROP FUNCTION {_function(table, 'claim')}")
        store = PostgresStore(pool, table=table)
        async with pool.acquire() as conn, conn.transaction():
            with pytest.raises(errors.ConfigError, match="schema version 3"):
                await store.transaction_store(conn)
    finally:
        await pool.close()


def _function(table: str, kind: str) -> str:
    import hashlib

    digest = hashlib.sha1(table.encode()).hexdigest()[:10]
    return f'"idempotency_async_v3_{kind}_{digest}"'


async def _one() -> int:
    return 1


# -- transactional steps ----------------------------------------------------------------------


class TxSetup:
    """A manager on a PostgresStore (server clock) and an effects table."""

    def __init__(self, server: PostgresServer, pool: Any, table: str) -> None:
        self.server = server
        self.pool = pool
        self.table = table
        self.store = PostgresStore(pool, table=table)
        self.ran: list[str] = []

    def manager(self, **options: Any) -> Manager:
        return manager(self.store, **options)

    async def effects(self) -> list[tuple[str, int]]:
        rows = await self.pool.fetch(f"SELECT id, n FROM {self.table}_fx ORDER BY n")
        return [(row[0], row[1]) for row in rows]

    async def record(self, key: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            f"SELECT status, owner, steps, step_count FROM {self.table} WHERE key = $1", key
        )
        return None if row is None else dict(row)

    def insert(self, conn: Any, n: int, *, style: str = "asyncpg") -> Any:
        """A step function: one row through ``conn``, returning ``{"n": n}``."""
        table = f"{self.table}_fx"

        async def run() -> dict[str, int]:
            self.ran.append(f"insert {n}")
            if style == "asyncpg":
                await conn.execute(f"INSERT INTO {table} VALUES ($1, $2)", "fx", n)
            elif style == "psycopg":
                await conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", ("fx", n))
            else:
                from sqlalchemy import text

                await conn.execute(text(f"INSERT INTO {table} VALUES ('fx', :n)"), {"n": n})
            return {"n": n}

        return run


@pytest.fixture
async def tx(postgres_server: PostgresServer) -> AsyncIterator[TxSetup]:
    pool = await postgres_server.pool()
    table = fresh_table_name()
    await create_table(pool, table=table)
    await pool.execute(f"CREATE TABLE {table}_fx (id text, n int)")
    try:
        yield TxSetup(postgres_server, pool, table)
    finally:
        await pool.close()


PAYLOAD = {"id": "order", "body": 1}


async def test_a_transactional_step_commits_its_rows_with_its_recovery_point(
    tx: TxSetup,
) -> None:
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    async with tx.pool.acquire() as conn:

        async def work() -> dict[str, Any]:
            first = await step("one", tx.insert(conn, 1), connection=conn)
            assert not conn.is_in_transaction()  # committed, the step's own
            row = await tx.record(key)
            assert row is not None and row["step_count"] == 1
            assert await tx.effects() == [("fx", 1)]
            if fail[0]:
                raise RuntimeError("after step one")
            second = await step("two", tx.insert(conn, 2), connection=conn)
            return {"results": [first, second]}

        fail = [True]
        with pytest.raises(RuntimeError):
            await calls.execute(PAYLOAD, work, timeout=30)
        row = await tx.record(key)
        assert row is not None and row["owner"] is None and row["step_count"] == 1
        fail[0] = False
        # The retry replays step one (its function does not run) and runs step two once.
        assert await calls.execute(PAYLOAD, work, timeout=30) == {"results": [{"n": 1}, {"n": 2}]}
    assert tx.ran == ["insert 1", "insert 2"]
    assert await tx.effects() == [("fx", 1), ("fx", 2)]
    row = await tx.record(key)
    assert row is not None and row["status"] == "COMPLETED" and row["steps"] is None


async def test_a_step_that_raises_rolls_its_rows_back_and_records_nothing(tx: TxSetup) -> None:
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    async with tx.pool.acquire() as conn:

        async def boom() -> None:
            await tx.insert(conn, 1)()
            raise ValueError("the step failed after its insert")

        async def work() -> None:
            await step("one", boom, connection=conn)

        with pytest.raises(ValueError):
            await calls.execute(PAYLOAD, work, timeout=30)
        assert not conn.is_in_transaction()
    assert await tx.effects() == []
    assert await tx.record(key) is None  # released: nothing recorded, so deleted


async def test_a_lost_lease_before_the_commit_leaves_neither_rows_nor_point(
    tx: TxSetup,
) -> None:
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    async with tx.pool.acquire() as conn:

        async def stolen() -> dict[str, int]:
            result = await tx.insert(conn, 1)()
            # Another worker takes the key while the step runs: the step function finds
            # no row of this owner and raises its SQLSTATE; the COMMIT never runs.
            await tx.pool.execute(f"UPDATE {tx.table} SET owner = 'thief' WHERE key = $1", key)
            return result

        async def work() -> None:
            await step("one", stolen, connection=conn)

        with pytest.raises(errors.LeaseLostError) as caught:
            await calls.execute(PAYLOAD, work, timeout=30)
        assert caught.value.result == {"n": 1}
        assert not conn.is_in_transaction()
    assert await tx.effects() == []
    row = await tx.record(key)
    assert row is not None and row["owner"] == "thief" and row["steps"] is None


async def test_a_connection_killed_before_the_commit_leaves_neither_and_a_retry_runs_once(
    tx: TxSetup,
) -> None:
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    conn = await tx.server.connect()
    pid = conn.get_server_pid()

    async def killed() -> dict[str, int]:
        result = await tx.insert(conn, 1)()
        await tx.pool.execute("SELECT pg_terminate_backend($1)", pid)
        return result

    async def work() -> str:
        await step("one", killed, connection=conn)
        return "done"

    with pytest.raises(errors.StepNotRecordedError):
        await calls.execute(PAYLOAD, work, timeout=1)  # its lease: one second
    assert await tx.effects() == []
    row = await tx.record(key)
    # Left to its lease (the write's outcome was unknown to the call), nothing recorded.
    assert row is not None and row["owner"] is not None and row["steps"] is None
    await asyncio.sleep(1.1)
    async with tx.pool.acquire() as fresh:

        async def again() -> str:
            await step("one", tx.insert(fresh, 1), connection=fresh)
            return "done"

        assert await calls.execute(PAYLOAD, again, timeout=30) == "done"
        assert await calls.execute(PAYLOAD, again, timeout=30) == "done"
    assert await tx.effects() == [("fx", 1)]


async def test_a_connection_in_a_transaction_is_refused_before_the_step_runs(
    tx: TxSetup,
) -> None:
    calls = tx.manager()
    async with tx.pool.acquire() as conn:

        async def work() -> None:
            async with conn.transaction():
                await step("one", tx.insert(conn, 1), connection=conn)

        with pytest.raises(errors.ConfigError, match="in one already"):
            await calls.execute(PAYLOAD, work, timeout=30)

        async def pooled() -> None:
            await step("one", tx.insert(conn, 1), connection=tx.pool)

        with pytest.raises(errors.ConfigError, match="acquire a connection"):
            await calls.execute({"id": "other", "body": 1}, pooled, timeout=30)
    assert tx.ran == [] and await tx.effects() == []


async def test_a_refused_transactional_step_leaves_its_name_free(tx: TxSetup) -> None:
    calls = tx.manager()
    async with tx.pool.acquire() as conn:

        async def work() -> dict[str, int]:
            async with conn.transaction():
                with pytest.raises(errors.ConfigError):
                    await step("one", tx.insert(conn, 1), connection=conn)
            return await step("one", tx.insert(conn, 2), connection=conn)

        assert await calls.execute(PAYLOAD, work, timeout=30) == {"n": 2}
    assert await tx.effects() == [("fx", 2)]


async def test_a_transactional_step_off_postgres_is_refused_before_it_runs(tx: TxSetup) -> None:
    from idempotency_async import MemoryStore

    calls = manager(MemoryStore())  # type: ignore[arg-type]
    async with tx.pool.acquire() as conn:

        async def work() -> None:
            await step("one", tx.insert(conn, 1), connection=conn)

        with pytest.raises(errors.ConfigError, match="needs a PostgresStore"):
            await calls.execute(PAYLOAD, work, timeout=30)
    assert tx.ran == []


async def test_in_execute_in_transaction_a_step_with_a_connection_just_runs(
    tx: TxSetup,
) -> None:
    calls = tx.manager()
    async with tx.pool.acquire() as conn, conn.transaction():

        async def work() -> dict[str, int]:
            return await step("one", tx.insert(conn, 1), connection=conn)

        assert await calls.execute_in_transaction(conn, PAYLOAD, work) == {"n": 1}
    assert await tx.effects() == [("fx", 1)]


@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_transactional_step_on_psycopg(tx: TxSetup, autocommit: bool) -> None:
    psycopg = pytest.importorskip("psycopg")
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    conn = await psycopg.AsyncConnection.connect(tx.server.dsn, autocommit=autocommit)
    try:

        async def boom() -> None:
            await tx.insert(conn, 9, style="psycopg")()
            raise ValueError("after the insert")

        async def work() -> dict[str, Any]:
            one = await step("one", tx.insert(conn, 1, style="psycopg"), connection=conn)
            if fail[0]:
                await step("two", boom, connection=conn)
            two = await step("two", tx.insert(conn, 2, style="psycopg"), connection=conn)
            return {"results": [one, two]}

        fail = [True]
        with pytest.raises(ValueError):
            await calls.execute(PAYLOAD, work, timeout=30)
        assert await tx.effects() == [("fx", 1)]
        row = await tx.record(key)
        assert row is not None and row["step_count"] == 1
        fail[0] = False
        result = await calls.execute(PAYLOAD, work, timeout=30)
        assert result == {"results": [{"n": 1}, {"n": 2}]}
        assert await tx.effects() == [("fx", 1), ("fx", 2)]
        assert tx.ran == ["insert 1", "insert 9", "insert 2"]
    finally:
        await conn.close()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_a_transactional_step_on_sqlalchemy(tx: TxSetup, driver: str, kind: str) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    engine = create_async_engine(tx.server.dsn.replace("postgres://", f"postgresql+{driver}://"))
    try:
        async with contextlib.AsyncExitStack() as stack:
            if kind == "connection":
                target: Any = await stack.enter_async_context(engine.connect())
            else:
                target = await stack.enter_async_context(AsyncSession(engine))

            async def boom() -> None:
                await tx.insert(target, 9, style="sqlalchemy")()
                raise ValueError("after the insert")

            async def work() -> dict[str, Any]:
                one = await step("one", tx.insert(target, 1, style="sqlalchemy"), connection=target)
                assert not target.in_transaction()
                if fail[0]:
                    await step("two", boom, connection=target)
                two = await step("two", tx.insert(target, 2, style="sqlalchemy"), connection=target)
                return {"results": [one, two]}

            fail = [True]
            with pytest.raises(ValueError):
                await calls.execute(PAYLOAD, work, timeout=30)
            assert await tx.effects() == [("fx", 1)]
            row = await tx.record(key)
            assert row is not None and row["step_count"] == 1
            fail[0] = False
            result = await calls.execute(PAYLOAD, work, timeout=30)
            assert result == {"results": [{"n": 1}, {"n": 2}]}
    finally:
        await engine.dispose()
    assert await tx.effects() == [("fx", 1), ("fx", 2)]
    assert tx.ran == ["insert 1", "insert 9", "insert 2"]


async def test_with_telemetry_a_transactional_steps_write_is_a_timed_round_trip(
    tx: TxSetup,
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from idempotency_async.otel import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    calls = tx.manager(telemetry=Telemetry(tracer_provider=provider))
    try:
        async with tx.pool.acquire() as conn:

            async def work() -> dict[str, int]:
                return await step("one", tx.insert(conn, 1), connection=conn)

            assert await calls.execute(PAYLOAD, work, timeout=30) == {"n": 1}
        (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("idempotency")]
        operations = [
            (e.attributes or {}).get("db.operation.name")
            for e in span.events
            if e.name.startswith("idempotency.store.")
        ]
        assert operations == ["claim", "record_step", "complete"]
    finally:
        provider.shutdown()
    assert await tx.effects() == [("fx", 1)]


class CountingConnection:
    """An asyncpg connection that counts what it sends (each call: one round trip)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.sent: list[str] = []

    def is_in_transaction(self) -> bool:
        return bool(self._conn.is_in_transaction())

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        self.sent.append(sql.split()[0])
        return await self._conn.fetchrow(sql, *args)

    async def execute(self, sql: str, *args: Any) -> Any:
        self.sent.append(sql.split()[0] + (" … COMMIT" if sql.endswith("; COMMIT") else ""))
        return await self._conn.execute(sql, *args)


async def test_a_transactional_step_adds_two_round_trips_on_asyncpg(tx: TxSetup) -> None:
    calls = tx.manager()
    async with tx.pool.acquire() as raw:
        conn = CountingConnection(raw)

        async def work() -> dict[str, int]:
            return await step("one", tx.insert(conn, 1), connection=conn)

        assert await calls.execute(PAYLOAD, work, timeout=30) == {"n": 1}
    # BEGIN; the step's own INSERT; the step function and the COMMIT in one message.
    assert conn.sent == ["BEGIN", "INSERT", "SELECT … COMMIT"]
    assert await tx.effects() == [("fx", 1)]


@pytest.mark.parametrize("point", ["in2", "after2"])
async def test_a_killed_process_leaves_each_transactional_step_once(
    tx: TxSetup, point: str
) -> None:
    import os
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("_postgres_steps_worker.py")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(worker), tx.server.dsn, tx.table, point, env=env
    )
    assert await process.wait() == -9  # SIGKILLed at the point
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    row = await tx.record(key)
    assert row is not None and row["owner"] is not None  # the dead holder's lease
    if point == "in2":
        # Step two's insert died with its transaction: neither it nor its point is there.
        assert await tx.effects() == [("fx", 1)] and row["step_count"] == 1
    else:
        assert await tx.effects() == [("fx", 1), ("fx", 2)] and row["step_count"] == 2
    await asyncio.sleep(1.2)  # the dead holder's lease (1 s) ends
    async with tx.pool.acquire() as conn:

        async def work() -> str:
            for n in (1, 2, 3):
                await step(f"step-{n}", tx.insert(conn, n), connection=conn)
            return "done"

        assert await calls.execute(PAYLOAD, work, timeout=30) == "done"
    # Each step's row exactly once; the resume ran only what was not committed.
    assert await tx.effects() == [("fx", 1), ("fx", 2), ("fx", 3)]
    assert tx.ran == (["insert 2", "insert 3"] if point == "in2" else ["insert 3"])


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_transactional_steps_result_travels_as_a_literal_intact(
    tx: TxSetup, driver: str
) -> None:
    tricky = {"s": "%s %(x)s $1 ' '' \\ \\' E'x' \u00e9 \U0001f600 ;COMMIT; --", "n": 1e300}
    if driver == "psycopg":
        psycopg = pytest.importorskip("psycopg")
        conn: Any = await psycopg.AsyncConnection.connect(tx.server.dsn, autocommit=True)
    else:
        conn = await tx.server.connect()
    calls = tx.manager()
    key = calls.key_for(PAYLOAD)
    try:

        async def value() -> dict[str, Any]:
            return tricky

        async def work() -> None:
            assert await step("one", value, connection=conn) == tricky
            raise RuntimeError("keep the progress")

        with pytest.raises(RuntimeError):
            await calls.execute(PAYLOAD, work, timeout=30)
    finally:
        await conn.close()
    row = await tx.record(key)
    assert row is not None and row["step_count"] == 1
    import json

    assert json.loads(row["steps"]) == [["one", tricky]]


async def test_a_transactional_step_whose_list_never_fits_rolls_back(tx: TxSetup) -> None:
    calls = manager(PostgresStore(tx.pool, table=tx.table, max_response_bytes=30))
    async with tx.pool.acquire() as conn:

        async def big() -> str:
            await tx.insert(conn, 1)()
            return "x" * 100

        async def work() -> None:
            await step("one", big, connection=conn)

        # Neither the result nor the note that it was not stored fits 30 bytes.
        with pytest.raises(errors.IdempotencyError):
            await calls.execute(PAYLOAD, work, timeout=30)
        assert not conn.is_in_transaction()
    assert await tx.effects() == []


async def test_racing_claims_resume_a_released_row_once(setup: Setup) -> None:
    store = setup.store
    keys = [f"race-{n}" for n in range(10)]
    for key in keys:
        assert await store.claim(claim(key=key)) is CLAIMED
        assert await store.record_step(write(ONE, 0, key=key)) is Stepped.RECORDED
        assert await store.release(key, "a") is True
    verdicts = await asyncio.gather(
        *(store.claim(claim(f"w{n}", key=key, now=NOW + 1)) for key in keys for n in range(3))
    )
    for index, key in enumerate(keys):
        mine = verdicts[3 * index : 3 * index + 3]
        claimed = [v for v in mine if v.found is Found.CLAIMED]
        assert len(claimed) == 1, (key, mine)
        assert claimed[0].record is not None and claimed[0].record.steps == ONE
        others = [v for v in mine if v.found is not Found.CLAIMED]
        assert all(v.found is Found.IN_PROGRESS for v in others)
        row = await setup.row(key)
        assert row is not None and row["owner"] == claimed[0].record.owner
        assert row["step_count"] == 1
