"""Interop with aws-lambda-powertools (Python)'s Redis layer on one redis-server, both ways.

Powertools' ``idempotent_function`` runs with its own ``RedisCachePersistenceLayer`` (the
sync redis-py client, in a worker thread) against the session's redis-server; a
``Manager`` with ``key_format="powertools-python"`` on
``RedisStore(record_format="powertools-python")`` shares the database.  Powertools
completes → we replay; we complete → Powertools replays; each side refuses the other's
live claim and takes over a lapsed one (through Powertools' ``<key>:lock``); validation
mismatches are reported on both sides; and the mixed-fleet limits of fencing are pinned
(see docs/migrate-from-powertools.md).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as redis_asyncio
from _redis import RedisServer
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyInconsistentStateError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
    RedisCachePersistenceLayer,
)
from test_powertools_python_interop import (
    ORDER,
    PREFIX,
    RESPONSE,
    TIMEOUT,
    LambdaContext,
    powertools_must_not_run,
    returning,
)
from test_powertools_python_keys import run_oldest
from test_typescript_interop import assert_same_json, must_not_run

from idempotency_async import Manager, Options, step
from idempotency_async.errors import (
    AlreadyInProgressError,
    ConfigError,
    LeaseLostError,
    PayloadValidationError,
    ResponseNotStoredError,
)
from idempotency_async.stores.redis import RedisStore

pytestmark = [
    pytest.mark.redis,
    # Powertools warns when idempotent_function runs without a registered Lambda context,
    # and marks its Redis layer deprecated in favour of the same class's new name.
    pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time:UserWarning"),
    pytest.mark.filterwarnings("ignore:RedisCachePersistenceLayer will be removed"),
]

DATABASE = 6  # this module's own database, flushed by each test


@pytest.fixture
async def shared_db(redis_server: RedisServer) -> AsyncIterator[redis_asyncio.Redis]:
    async with redis_server.client(db=DATABASE) as client:
        await client.flushdb()
        yield client


@pytest.fixture
def sync_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    # decode_responses=True, as Powertools' own RedisConnection builds its client.
    client = redis.Redis(
        host="127.0.0.1", port=redis_server.port, db=DATABASE, decode_responses=True
    )
    yield client
    client.close()


def powertools_function(
    client: redis.Redis,
    body: Callable[[dict[str, Any]], Any],
    *,
    validation: str | None = None,
    context: LambdaContext | None = None,
) -> Callable[[dict[str, Any]], Any]:
    """``idempotent_function`` on ``body`` over Powertools' Redis layer, keyed on ``id``."""
    config = IdempotencyConfig(event_key_jmespath="id", payload_validation_jmespath=validation)
    if context is not None:
        config.register_lambda_context(context)  # sets in_progress_expiration
    decorated = idempotent_function(
        body,
        data_keyword_argument="order",
        persistence_store=RedisCachePersistenceLayer(client=client),
        config=config,
        key_prefix=PREFIX,
    )
    return lambda order: decorated(order=order)


def manager(
    client: redis_asyncio.Redis,
    *,
    validation: str | None = None,
    clock: Callable[[], float] | None = None,
    **store_options: Any,
) -> Manager:
    store = RedisStore(
        client,
        record_format="powertools-python",
        judged_by="server" if clock is None else "client",
        **store_options,
    )
    options = Options(
        key_format="powertools-python",
        key_prefix=PREFIX,
        event_key_jmespath="id",
        payload_validation_jmespath=validation,
        clock=clock or time.time,
    )
    return Manager(store, options)


async def record(client: redis_asyncio.Redis, key: str) -> dict[str, Any]:
    raw = await client.get(key)
    assert raw is not None, f"no record at {key}"
    value = json.loads(raw)
    assert isinstance(value, dict)
    return value


async def work() -> dict[str, Any]:
    return RESPONSE


# -- Powertools completes, we replay ------------------------------------------------------


async def test_we_replay_a_powertools_record(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    run = powertools_function(sync_client, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE

    ours = manager(shared_db)
    key = ours.key_for(ORDER)
    assert await shared_db.keys("*") == [key.encode()]  # no prefix of our own
    stored = await record(shared_db, key)
    assert set(stored) == {"data", "status", "expiration"}
    assert stored["status"] == "COMPLETED" and isinstance(stored["data"], str)
    assert 0 < await shared_db.ttl(key) <= 3600  # Powertools' EX: its expiry, in seconds

    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), RESPONSE)


# -- we complete, Powertools replays ------------------------------------------------------


async def test_powertools_replays_our_record(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db)
    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
    key = ours.key_for(ORDER)
    stored = await record(shared_db, key)
    assert stored["status"] == "COMPLETED" and "owner" in stored
    assert isinstance(stored["data"], str)  # JSON text, as Powertools writes it
    assert_same_json(json.loads(stored["data"]), RESPONSE)
    assert stored["expiration"] - time.time() == pytest.approx(3600, abs=5)

    run = powertools_function(sync_client, powertools_must_not_run)
    assert_same_json(await asyncio.to_thread(run, ORDER), RESPONSE)


async def test_a_response_that_was_not_stored(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db, max_response_bytes=64)

    async def large() -> str:
        return "x" * 1000

    assert await ours.execute(ORDER, large, timeout=TIMEOUT) == "x" * 1000
    stored = await record(shared_db, ours.key_for(ORDER))
    assert stored["data_format"].startswith("not-stored")
    assert stored["data"] == "null"  # Powertools 3.0 cannot read a record without data
    with pytest.raises(ResponseNotStoredError):
        await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
    # Powertools finds no data and replays None.
    run = powertools_function(sync_client, powertools_must_not_run)
    assert await asyncio.to_thread(run, ORDER) is None


# -- live claims are refused both ways ----------------------------------------------------


@pytest.mark.parametrize("with_context", [True, False], ids=["lambda-context", "no-context"])
async def test_we_refuse_a_live_powertools_claim(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis, with_context: bool
) -> None:
    started, finish = threading.Event(), threading.Event()

    def slow(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        return RESPONSE

    context = LambdaContext() if with_context else None
    run = powertools_function(sync_client, slow, context=context)
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    ours = manager(shared_db)
    try:
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        stored = await record(shared_db, ours.key_for(ORDER))
        assert stored["status"] == "INPROGRESS"
        assert ("in_progress_expiration" in stored) == with_context
        with pytest.raises(AlreadyInProgressError) as caught:
            await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
        # With a Lambda context the lease is the invocation's time left; without one,
        # Powertools writes no lease and the claim holds until the record expires.
        assert caught.value.retry_after is not None
        assert (caught.value.retry_after <= 30) == with_context
    finally:
        finish.set()
        assert await running == RESPONSE
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), RESPONSE)


async def test_powertools_refuses_our_live_claim(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db)
    run = powertools_function(sync_client, powertools_must_not_run)

    async def inside() -> dict[str, Any]:
        with pytest.raises(IdempotencyAlreadyInProgressError):
            await asyncio.to_thread(run, ORDER)
        return RESPONSE

    assert await ours.execute(ORDER, inside, timeout=TIMEOUT) is RESPONSE
    assert_same_json(await asyncio.to_thread(run, ORDER), RESPONSE)


# -- lapsed claims are taken over both ways, through Powertools' <key>:lock ---------------


async def abandoned_claim(ours: Manager) -> None:
    """Claim ORDER and crash inside the call: no store write, the claim stays."""
    entered = asyncio.Event()

    async def hang() -> Any:
        entered.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(ours.execute(ORDER, hang, timeout=TIMEOUT))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_powertools_takes_over_our_lapsed_claim(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    # A clock ten minutes behind: our lease ended long ago by the real clock.
    ours = manager(shared_db, clock=lambda: time.time() - 600)
    await abandoned_claim(ours)
    key = ours.key_for(ORDER)
    assert (await record(shared_db, key))["status"] == "INPROGRESS"

    run = powertools_function(sync_client, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE
    assert await shared_db.get(f"{key}:lock") == b"True"  # Powertools took its lock


async def test_we_take_over_a_lapsed_powertools_claim_with_its_lock(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    started, finish = threading.Event(), threading.Event()

    def stuck(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        raise RuntimeError("gave up")

    # The invocation had no time left: its lease ended at once.
    run = powertools_function(sync_client, stuck, context=LambdaContext(-60_000))
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    ours = manager(shared_db)
    key = ours.key_for(ORDER)
    try:
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        # While another worker holds the lock (a Powertools takeover under way), we wait.
        await shared_db.set(f"{key}:lock", "True", ex=10)
        with pytest.raises(AlreadyInProgressError) as caught:
            await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
        assert caught.value.retry_after == 10
        # Powertools waits too: the lock is what keeps two takeovers apart.
        second = powertools_function(sync_client, powertools_must_not_run)
        with pytest.raises(IdempotencyInconsistentStateError):
            await asyncio.to_thread(second, ORDER)
        await shared_db.delete(f"{key}:lock")

        calls = 0

        async def counted() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            return RESPONSE

        assert await ours.execute(ORDER, counted, timeout=TIMEOUT) is RESPONSE
        assert calls == 1
        # We took the lock as Powertools does, so a Powertools takeover racing ours fails
        # to take it and re-reads the record instead of overwriting our claim.
        assert await shared_db.get(f"{key}:lock") == b"True"
        assert 0 < await shared_db.ttl(f"{key}:lock") <= 10
    finally:
        finish.set()
        with pytest.raises(RuntimeError):
            await running
    # G1(e): Powertools deletes on failure without an owner condition — our completed
    # record is gone, and the key runs again.
    assert await shared_db.get(key) is None


# -- fencing in a mixed fleet -------------------------------------------------------------


async def test_our_late_completion_never_overwrites_a_powertools_takeover(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db, clock=lambda: time.time() - 600)  # our lease has lapsed
    taken_over = {"by": "powertools"}
    run = powertools_function(sync_client, returning(taken_over))

    async def late() -> dict[str, Any]:
        assert await asyncio.to_thread(run, ORDER) == taken_over  # Powertools took over
        return RESPONSE

    with pytest.raises(LeaseLostError) as caught:
        await ours.execute(ORDER, late, timeout=TIMEOUT)
    assert caught.value.result is RESPONSE
    assert_same_json(await manager(shared_db).execute(ORDER, must_not_run), taken_over)


async def test_a_late_powertools_completion_overwrites_ours(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    # The limit of fencing in a mixed fleet (G1(e)): Powertools completes with a plain SET,
    # so its late write replaces the record of the call that took over.
    started, finish = threading.Event(), threading.Event()
    late = {"by": "late powertools"}

    def slow(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        return late

    run = powertools_function(sync_client, slow, context=LambdaContext(-60_000))
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    assert await asyncio.to_thread(started.wait, TIMEOUT)
    ours = manager(shared_db)
    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
    finish.set()
    assert await running == late
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), late)


# -- validation ---------------------------------------------------------------------------


async def test_validation_mismatch_on_our_record_is_reported_on_both_sides(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db, validation="amount")
    run = powertools_function(sync_client, powertools_must_not_run, validation="amount")

    async def inside() -> dict[str, Any]:
        # Our live claim carries the hash: Powertools reports the mismatch.
        with pytest.raises(IdempotencyValidationError):
            await asyncio.to_thread(run, {**ORDER, "amount": 99.0})
        return RESPONSE

    assert await ours.execute(ORDER, inside, timeout=TIMEOUT) is RESPONSE
    stored = await record(shared_db, ours.key_for(ORDER))
    assert isinstance(stored["validation"], str)  # kept on completion, unlike Powertools
    with pytest.raises(IdempotencyValidationError):
        await asyncio.to_thread(run, {**ORDER, "amount": 99.0})
    with pytest.raises(PayloadValidationError):
        await ours.execute({**ORDER, "amount": 99.0}, must_not_run, timeout=TIMEOUT)
    assert_same_json(await asyncio.to_thread(run, ORDER), RESPONSE)


async def test_validation_on_powertools_records(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    started, finish = threading.Event(), threading.Event()

    def slow(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        return RESPONSE

    run = powertools_function(sync_client, slow, validation="amount", context=LambdaContext())
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    ours = manager(shared_db, validation="amount")
    try:
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        # Powertools' live claim carries the hash: we report a changed payload.
        with pytest.raises(PayloadValidationError):
            await ours.execute({**ORDER, "amount": 99.0}, must_not_run, timeout=TIMEOUT)
        with pytest.raises(AlreadyInProgressError):
            await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
    finally:
        finish.set()
        assert await running == RESPONSE
    # Powertools' Redis layer drops the hash when it completes, and then compares it
    # anyway: a completed Powertools record fails validation for every payload, on
    # Powertools' side and, replaying as it does, on ours.
    stored = await record(shared_db, ours.key_for(ORDER))
    assert "validation" not in stored
    with pytest.raises(IdempotencyValidationError):
        await asyncio.to_thread(run, ORDER)
    with pytest.raises(PayloadValidationError):
        await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
    # Without validation configured, both replay it.
    assert_same_json(await manager(shared_db).execute(ORDER, must_not_run), RESPONSE)


# -- configuration ------------------------------------------------------------------------


# -- recovery points (steps) --------------------------------------------------------------


async def test_powertools_refuses_our_live_claim_carrying_steps(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    ours = manager(shared_db)
    stepped, finish = asyncio.Event(), asyncio.Event()

    async def slow() -> Any:
        await step("one", lambda: asyncio.sleep(0, {"data": 1}))
        stepped.set()
        await finish.wait()
        return RESPONSE

    holder = asyncio.create_task(ours.execute(ORDER, slow, timeout=TIMEOUT))
    try:
        await stepped.wait()
        assert (await record(shared_db, ours.key_for(ORDER)))["step_count"] == 1
        run = powertools_function(sync_client, powertools_must_not_run)
        with pytest.raises(IdempotencyAlreadyInProgressError):
            await asyncio.to_thread(run, ORDER)
    finally:
        finish.set()
    assert await holder == RESPONSE
    assert (
        await asyncio.to_thread(powertools_function(sync_client, powertools_must_not_run), ORDER)
        == RESPONSE
    )


async def test_powertools_takes_over_a_released_record_dropping_its_steps(
    shared_db: redis_asyncio.Redis, sync_client: redis.Redis
) -> None:
    # Released with progress kept: a lapsed claim to Powertools, which takes its lock and
    # replaces the record with a plain SET (docs/redis.md): it runs from the start.
    ours = manager(shared_db)

    async def fails() -> Any:
        await step("one", lambda: asyncio.sleep(0, 1))
        raise RuntimeError("after the step")

    with pytest.raises(RuntimeError):
        await ours.execute(ORDER, fails, timeout=TIMEOUT)
    key = ours.key_for(ORDER)
    released = await record(shared_db, key)
    assert released["step_count"] == 1 and "owner" not in released

    run = powertools_function(sync_client, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE
    assert await shared_db.get(f"{key}:lock") == b"True"  # Powertools took its lock
    assert "steps" not in await record(shared_db, key)
    assert await ours.execute(ORDER, must_not_run, timeout=TIMEOUT) == RESPONSE


async def test_the_manager_refuses_mismatched_formats(redis_server: RedisServer) -> None:
    options = Options(key_format="powertools-python", event_key_jmespath="id")
    store = RedisStore.from_url(redis_server.url)
    with pytest.raises(ConfigError, match=r"RedisStore\(\.\.\., record_format='powertools-python'"):
        Manager(store, options)
    await store.aclose()
    store = RedisStore.from_url(redis_server.url, record_format="powertools-python")
    assert store.record_format == "powertools-python"
    with pytest.raises(ConfigError, match="record_format"):
        Manager(store, Options(event_key_jmespath="id"))
    Manager(store, options)
    await store.aclose()
    with pytest.raises(ConfigError, match="record_format must be one of"):
        RedisStore.from_url(redis_server.url, record_format="python")  # type: ignore[arg-type]


async def test_takeover_on_a_cluster(redis_cluster: RedisServer) -> None:
    # The lock lives in another slot than the record: taken with its own command.
    async with redis_cluster.cluster_client() as client:
        prefix = f"pt-{time.time_ns()}:"
        ours = manager(client, clock=lambda: time.time() - 600, key_prefix=prefix)
        await abandoned_claim(ours)
        taking_over = manager(client, key_prefix=prefix)
        assert await taking_over.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
        assert await client.get(f"{prefix}{ours.key_for(ORDER)}:lock") == b"True"
        assert_same_json(await taking_over.execute(ORDER, must_not_run), RESPONSE)


# -- the oldest supported release, 3.0.0 --------------------------------------------------

OLDEST_PREFIX = "test-func._powertools_corpus.process_order"  # no key_prefix before 3.5


async def test_powertools_3_0_records_replay_both_ways(
    shared_db: redis_asyncio.Redis, redis_server: RedisServer
) -> None:
    store = RedisStore(shared_db, record_format="powertools-python", max_response_bytes=64)
    ours = Manager(
        store,
        Options(key_format="powertools-python", key_prefix=OLDEST_PREFIX, event_key_jmespath="id"),
    )

    def oldest(order: Any, response: Any, *, may_run: bool) -> Any:
        port, orders, answer = str(redis_server.port), json.dumps(order), json.dumps(response)
        yes = "yes" if may_run else "no"
        return run_oldest("redis", port, str(DATABASE), orders, answer, yes)

    # 3.0.0 completes, we replay.
    small = {"ok": True, "n": 2**70}
    written = await asyncio.to_thread(oldest, ORDER, small, may_run=True)
    assert written["ran"]
    assert await shared_db.keys("*") == [ours.key_for(ORDER).encode()]
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), small)

    # We complete, 3.0.0 replays; a response we did not store replays as None there.
    for index, response in enumerate([small, "x" * 100]):
        other = {**ORDER, "id": f"o-300{index}"}

        async def body(response: Any = response) -> Any:
            return response

        await ours.execute(other, body, timeout=TIMEOUT)
        replayed = await asyncio.to_thread(oldest, other, None, may_run=False)
        assert not replayed["ran"]
        assert_same_json(replayed["result"], None if index else small)
