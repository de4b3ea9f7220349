"""Interop with aws-lambda-powertools (Python) on one moto table, both directions.

Powertools' ``idempotent_function`` and ``@idempotent`` run with its own
``DynamoDBPersistenceLayer`` (boto3, in a worker thread) against the session's moto server;
a ``Manager`` with ``key_format="powertools-python"`` on
``DynamoDBStore(record_format="powertools-python")`` shares the table.  Powertools
completes → we replay; we complete → Powertools replays; each side refuses the other's
live claim and takes over a lapsed one; validation mismatches are reported on both sides;
and the mixed-fleet limits of fencing are pinned (see docs/migrate-from-powertools.md).
The last test replays records both ways with the oldest supported release, 3.0.0, run in a
subprocess (see test_powertools_python_keys.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import boto3
import pytest
from _moto import REGION, fresh_table, open_client
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)
from test_powertools_python_keys import run_oldest
from test_typescript_interop import assert_same_json, must_not_run, only_item

from idempotency_async import Manager, Options, step
from idempotency_async.errors import (
    AlreadyInProgressError,
    LeaseLostError,
    PayloadValidationError,
    ResponseNotStoredError,
)
from idempotency_async.integrations.aws_lambda import idempotent_handler
from idempotency_async.stores.dynamodb import DynamoDBStore

pytestmark = [
    pytest.mark.dynamodb,
    # Powertools warns when idempotent_function runs without a registered Lambda context.
    pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time:UserWarning"),
]

PREFIX = "orders"
TIMEOUT = 20.0
ORDER = {"id": "o-1001", "amount": 12.5, "customer": {"name": "Zoë"}}
# Every JSON type, nested; whole-number floats and wide integers keep their types, since
# the response travels as JSON text.
RESPONSE: dict[str, Any] = {
    "statusCode": 201,
    "ok": True,
    "nothing": None,
    "message": "commande acceptée ✓ 😀",
    "amount": 129.95,
    "whole": 2.0,
    "wide": 2**70,
    "tiny": 1e-7,
    "order": {"lines": [{"sku": "A-1", "qty": 2}], "meta": {}, "tags": []},
}


class LambdaContext:
    """What Powertools reads from a Lambda context: the time left."""

    function_name = "orders-fn"
    aws_request_id = "req-1"

    def __init__(self, remaining_ms: int = 30_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture
async def shared_table(moto_endpoint: str) -> AsyncIterator[tuple[Any, str]]:
    async with open_client(moto_endpoint) as client:
        yield client, await fresh_table(client)


def powertools_layer(endpoint: str, table: str, **options: Any) -> DynamoDBPersistenceLayer:
    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        aws_session_token="testing",
    )
    return DynamoDBPersistenceLayer(table_name=table, boto3_client=client, **options)


def powertools_function(
    endpoint: str,
    table: str,
    body: Callable[[dict[str, Any]], Any],
    *,
    validation: str | None = None,
    context: LambdaContext | None = None,
) -> Callable[[dict[str, Any]], Any]:
    """``idempotent_function`` on ``body``, keyed like :func:`manager` keys (``id``)."""
    config = IdempotencyConfig(event_key_jmespath="id", payload_validation_jmespath=validation)
    if context is not None:
        config.register_lambda_context(context)  # sets in_progress_expiration
    decorated = idempotent_function(
        body,
        data_keyword_argument="order",
        persistence_store=powertools_layer(endpoint, table),
        config=config,
        key_prefix=PREFIX,
    )
    return lambda order: decorated(order=order)


def manager(
    client: Any,
    table: str,
    *,
    validation: str | None = None,
    clock: Callable[[], float] = time.time,
    **store_options: Any,
) -> Manager:
    store = DynamoDBStore(
        client, table_name=table, record_format="powertools-python", **store_options
    )
    options = Options(
        key_format="powertools-python",
        key_prefix=PREFIX,
        event_key_jmespath="id",
        payload_validation_jmespath=validation,
        clock=clock,
    )
    return Manager(store, options)


def powertools_must_not_run(order: Any) -> Any:
    raise AssertionError("the Powertools function ran: our record was not replayed")


def returning(value: Any) -> Callable[[Any], Any]:
    def body(order: Any) -> Any:
        return value

    return body


# -- Powertools completes, we replay ------------------------------------------------------


async def test_we_replay_a_powertools_record(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    run = powertools_function(moto_endpoint, table, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE

    ours = manager(client, table)
    item = await only_item(client, table)
    assert item["id"]["S"] == ours.key_for(ORDER)
    assert item["status"] == {"S": "COMPLETED"}
    assert "S" in item["data"] and "owner" not in item

    replayed = await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
    assert_same_json(replayed, RESPONSE)


async def test_we_replay_a_powertools_lambda_handler(
    moto_endpoint: str, shared_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No key_prefix on either side: both derive <function name>.<module>.<qualname>.
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    client, table = shared_table
    event = {"body": '{"order_id": "o-7"}', "requestContext": {"requestId": "r-1"}}
    config = IdempotencyConfig(event_key_jmespath="powertools_json(body).order_id")

    def handler(event: Any, context: Any) -> Any:
        return RESPONSE

    powertools_handler = idempotent(
        handler, persistence_store=powertools_layer(moto_endpoint, table), config=config
    )
    assert await asyncio.to_thread(powertools_handler, event, LambdaContext()) == RESPONSE
    item = await only_item(client, table)
    assert item["id"]["S"].startswith(f"orders-fn.{__name__}.{handler.__qualname__}#")
    assert "in_progress_expiration" in item  # Powertools registered the Lambda context

    store = DynamoDBStore(client, table_name=table, record_format="powertools-python")
    options = Options(
        key_format="powertools-python", event_key_jmespath="powertools_json(body).order_id"
    )

    async def migrated(event: Any, context: Any) -> Any:
        raise AssertionError("the handler ran: the Powertools record was not replayed")

    functools.update_wrapper(migrated, handler)  # the migrated handler keeps its name
    ours = idempotent_handler(Manager(store, options))(migrated)
    assert_same_json(await ours(event, LambdaContext()), RESPONSE)


# -- we complete, Powertools replays ------------------------------------------------------


async def test_powertools_replays_our_record(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table)

    async def work() -> dict[str, Any]:
        return RESPONSE

    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
    item = await only_item(client, table)
    assert item["status"] == {"S": "COMPLETED"} and "S" in item["data"]
    assert "data_format" not in item and "in_progress_expiration" not in item

    run = powertools_function(moto_endpoint, table, powertools_must_not_run)
    assert_same_json(await asyncio.to_thread(run, ORDER), RESPONSE)


# -- live claims are refused both ways ----------------------------------------------------


@pytest.mark.parametrize("with_context", [True, False], ids=["lambda-context", "no-context"])
async def test_we_refuse_a_live_powertools_claim(
    moto_endpoint: str, shared_table: tuple[Any, str], with_context: bool
) -> None:
    client, table = shared_table
    started, finish = threading.Event(), threading.Event()

    def slow(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        return RESPONSE

    context = LambdaContext() if with_context else None
    run = powertools_function(moto_endpoint, table, slow, context=context)
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    try:
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        ours = manager(client, table)
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
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table)
    run = powertools_function(moto_endpoint, table, powertools_must_not_run)

    async def work() -> dict[str, Any]:
        with pytest.raises(IdempotencyAlreadyInProgressError):
            await asyncio.to_thread(run, ORDER)
        return RESPONSE

    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
    assert_same_json(await asyncio.to_thread(run, ORDER), RESPONSE)


# -- lapsed claims are taken over both ways -----------------------------------------------


async def test_powertools_takes_over_our_lapsed_claim(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    # A clock ten minutes behind: our lease ended long ago by the real clock.
    ours = manager(client, table, clock=lambda: time.time() - 600)
    inside = asyncio.Event()

    async def hang() -> Any:
        inside.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(ours.execute(ORDER, hang, timeout=TIMEOUT))
    await inside.wait()
    task.cancel()  # a crash: no store write, the claim stays
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await only_item(client, table))["status"] == {"S": "INPROGRESS"}

    run = powertools_function(moto_endpoint, table, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE


async def test_powertools_takes_over_our_released_record_and_drops_its_steps(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    # Our call recorded a step, then raised: released with its progress kept (no owner, a
    # lease end long past).  Powertools reads it as a lapsed claim, replaces it and runs:
    # a writer that does not fence (G1(e)).
    client, table = shared_table
    ours = manager(client, table)

    async def fails_after_a_step() -> Any:
        await step("create", lambda: asyncio.sleep(0, {"order": "o1"}))
        raise RuntimeError("after the step")

    with pytest.raises(RuntimeError):
        await ours.execute(ORDER, fails_after_a_step, timeout=TIMEOUT)
    released = await only_item(client, table)
    assert "owner" not in released and "steps" in released

    run = powertools_function(moto_endpoint, table, returning(RESPONSE))
    assert await asyncio.to_thread(run, ORDER) == RESPONSE
    written = await only_item(client, table)
    assert written["status"] == {"S": "COMPLETED"} and "steps" not in written
    assert await ours.execute(ORDER, must_not_run, timeout=TIMEOUT) == RESPONSE


async def test_we_take_over_a_lapsed_powertools_claim(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    started, finish = threading.Event(), threading.Event()

    def stuck(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        raise RuntimeError("gave up")

    # The invocation had no time left: its lease ended at once.
    run = powertools_function(moto_endpoint, table, stuck, context=LambdaContext(-60_000))
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    try:
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        calls = 0

        async def work() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            return RESPONSE

        assert await manager(client, table).execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
        assert calls == 1
    finally:
        finish.set()
        with pytest.raises(RuntimeError):
            await running
    # G1(e): Powertools deletes on failure without an owner condition — our completed
    # record is gone, and the key runs again.
    assert (await client.scan(TableName=table))["Items"] == []


# -- fencing in a mixed fleet -------------------------------------------------------------


async def test_our_late_completion_never_overwrites_a_powertools_takeover(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table, clock=lambda: time.time() - 600)  # our lease has lapsed
    taken_over = {"by": "powertools"}
    run = powertools_function(moto_endpoint, table, returning(taken_over))

    async def late() -> dict[str, Any]:
        assert await asyncio.to_thread(run, ORDER) == taken_over  # Powertools took over
        return RESPONSE

    with pytest.raises(LeaseLostError) as caught:
        await ours.execute(ORDER, late, timeout=TIMEOUT)
    assert caught.value.result is RESPONSE
    item = await only_item(client, table)
    assert item["status"] == {"S": "COMPLETED"}
    assert_same_json(await manager(client, table).execute(ORDER, must_not_run), taken_over)


async def test_a_late_powertools_completion_overwrites_ours(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    # The limit of fencing in a mixed fleet (G1(e)): Powertools completes without an owner
    # condition, so its late write replaces the record of the call that took over.
    client, table = shared_table
    started, finish = threading.Event(), threading.Event()
    late = {"by": "late powertools"}

    def slow(order: Any) -> Any:
        started.set()
        assert finish.wait(TIMEOUT)
        return late

    run = powertools_function(moto_endpoint, table, slow, context=LambdaContext(-60_000))
    running = asyncio.create_task(asyncio.to_thread(run, ORDER))
    assert await asyncio.to_thread(started.wait, TIMEOUT)

    async def work() -> dict[str, Any]:
        return RESPONSE

    ours = manager(client, table)
    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE
    finish.set()
    assert await running == late
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), late)


# -- validation ---------------------------------------------------------------------------


async def test_validation_mismatch_is_reported_on_both_sides(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table, validation="amount")
    run = powertools_function(moto_endpoint, table, returning(RESPONSE), validation="amount")
    assert await asyncio.to_thread(run, ORDER) == RESPONSE
    item = await only_item(client, table)
    assert "validation" in item

    changed = {**ORDER, "amount": 99.0}
    with pytest.raises(PayloadValidationError):
        await ours.execute(changed, must_not_run, timeout=TIMEOUT)
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), RESPONSE)

    # And the other way round, on a record we wrote.
    other = {**ORDER, "id": "o-2002"}

    async def work() -> dict[str, Any]:
        return RESPONSE

    await ours.execute(other, work, timeout=TIMEOUT)
    with pytest.raises(IdempotencyValidationError):
        await asyncio.to_thread(run, {**other, "amount": 99.0})
    assert_same_json(await asyncio.to_thread(run, other), RESPONSE)


async def test_validation_mismatch_on_a_live_claim_both_ways(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table, validation="amount")
    run = powertools_function(moto_endpoint, table, powertools_must_not_run, validation="amount")

    async def work() -> dict[str, Any]:
        with pytest.raises(IdempotencyValidationError):
            await asyncio.to_thread(run, {**ORDER, "amount": 99.0})
        return RESPONSE

    assert await ours.execute(ORDER, work, timeout=TIMEOUT) is RESPONSE


# -- responses ----------------------------------------------------------------------------


async def test_falsy_responses(moto_endpoint: str, shared_table: tuple[Any, str]) -> None:
    # Powertools (3.1 and later) replays a falsy stored response as None; we replay the
    # stored value (docs/migrate-from-powertools.md).
    client, table = shared_table
    run = powertools_function(moto_endpoint, table, returning({}))
    assert await asyncio.to_thread(run, ORDER) == {}
    assert (await only_item(client, table))["data"] == {"S": "{}"}
    assert await asyncio.to_thread(run, ORDER) is None
    assert await manager(client, table).execute(ORDER, must_not_run, timeout=TIMEOUT) == {}
    # The documented hook replays as Powertools does.
    store = DynamoDBStore(client, table_name=table, record_format="powertools-python")
    options = Options(
        key_format="powertools-python",
        key_prefix=PREFIX,
        event_key_jmespath="id",
        response_hook=lambda response, record: response or None,
    )
    assert await Manager(store, options).execute(ORDER, must_not_run, timeout=TIMEOUT) is None


async def test_a_response_that_was_not_stored(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    ours = manager(client, table, max_response_bytes=64)

    async def large() -> str:
        return "x" * 1000

    assert await ours.execute(ORDER, large, timeout=TIMEOUT) == "x" * 1000
    item = await only_item(client, table)
    assert "data" not in item and item["data_format"]["S"].startswith("not-stored")
    with pytest.raises(ResponseNotStoredError):
        await ours.execute(ORDER, must_not_run, timeout=TIMEOUT)
    # Powertools finds no data and replays None.
    run = powertools_function(moto_endpoint, table, powertools_must_not_run)
    assert await asyncio.to_thread(run, ORDER) is None


async def test_a_response_too_large_for_an_item_is_not_compressed(
    shared_table: tuple[Any, str],
) -> None:
    client, table = shared_table
    ours = manager(client, table)
    text = "".join(f"{index:07d}" for index in range(60_000))  # 420 KB: over the item limit

    async def large() -> str:
        return text

    assert await ours.execute(ORDER, large, timeout=TIMEOUT) == text
    item = await only_item(client, table)
    assert "data" not in item  # Powertools cannot read compressed data: not stored
    assert "as JSON text" in item["data_format"]["S"]


async def test_composite_key_tables_are_shared(
    moto_endpoint: str, shared_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sort-key mode: the partition key holds idempotency#<function name>, untrimmed as
    # Powertools leaves it.
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", " orders-fn ")
    client, _ = shared_table
    table = await fresh_table(client, sort_key=True)
    config = IdempotencyConfig(event_key_jmespath="id")
    run = idempotent_function(
        returning(RESPONSE),
        data_keyword_argument="order",
        persistence_store=powertools_layer(moto_endpoint, table, sort_key_attr="sk"),
        config=config,
        key_prefix=PREFIX,
    )
    assert await asyncio.to_thread(lambda: run(order=ORDER)) == RESPONSE
    item = await only_item(client, table)
    assert item["id"] == {"S": "idempotency# orders-fn "}

    ours = manager(client, table, sort_key_attr="sk")
    assert item["sk"]["S"] == ours.key_for(ORDER)
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), RESPONSE)


# -- the oldest supported release, 3.0.0 --------------------------------------------------

OLDEST_PREFIX = "test-func._powertools_corpus.process_order"  # no key_prefix before 3.5


async def test_powertools_3_0_records_replay_both_ways(
    moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    store = DynamoDBStore(client, table_name=table, record_format="powertools-python")
    ours = Manager(
        store,
        Options(key_format="powertools-python", key_prefix=OLDEST_PREFIX, event_key_jmespath="id"),
    )

    def oldest(order: Any, response: Any, *, may_run: bool) -> Any:
        arguments = [moto_endpoint, table, json.dumps(order), json.dumps(response)]
        return run_oldest("dynamodb", *arguments, "yes" if may_run else "no")

    # 3.0.0 completes, we replay.
    written = await asyncio.to_thread(oldest, ORDER, RESPONSE, may_run=True)
    assert written["ran"]
    assert (await only_item(client, table))["id"]["S"] == ours.key_for(ORDER)
    assert_same_json(await ours.execute(ORDER, must_not_run, timeout=TIMEOUT), RESPONSE)

    # We complete, 3.0.0 replays.
    other = {**ORDER, "id": "o-3003"}

    async def work() -> dict[str, Any]:
        return RESPONSE

    await ours.execute(other, work, timeout=TIMEOUT)
    replayed = await asyncio.to_thread(oldest, other, None, may_run=False)
    assert not replayed["ran"]
    assert_same_json(replayed["result"], RESPONSE)
