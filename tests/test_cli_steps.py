"""``idempotency-async get`` and ``list`` show a record's recovery points (steps), and tell
a record released with its progress kept from one whose holder crashed.

The rendering is checked on the records a real MemoryStore holds after real calls (the
command cannot reach a MemoryStore); the command itself runs as operators run it on every
shared store — PostgreSQL, Redis, DynamoDB (moto) — after a real call recorded two steps
there and failed.  Those tests need their server: without it they skip loudly, and fail
under ``CI=true``, as the rest of the suite.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from _cli import cli

from idempotency_async import Manager, MemoryStore, Options, Status, step
from idempotency_async.cli._render import record_json, record_lines, record_row, state_of
from idempotency_async.record import Record
from idempotency_async.stores.base import RecordsSteps, Store

ORDER = {"order_id": "o-1"}


async def _failed_after_two_steps(store: Store) -> tuple[Manager, Record | None, Record]:
    """A call on ``store`` that records two steps (the second result not storable as
    JSON) and then raises: the record as it was during the call, and after it."""
    manager = Manager(store, Options(key_prefix="shop", event_key_jmespath="order_id"))
    key = manager.key_for(ORDER)
    during: list[Record | None] = []

    async def place() -> None:
        await step("create_order", lambda: asyncio.sleep(0, {"id": "ord_1"}))
        try:
            await step("charge", lambda: asyncio.sleep(0, {"when": object()}))
        except Exception as exc:
            assert type(exc).__name__ == "StepResultNotStoredError"
        during.append((await store.get(key, now=time.time())).record)
        raise ConnectionError("the mail server is down")

    with pytest.raises(ConnectionError):
        await manager.execute(ORDER, place, timeout=30)
    after = (await store.get(key, now=time.time())).record
    assert after is not None
    return manager, during[0], after


async def test_a_released_record_shows_its_steps_and_that_a_retry_resumes() -> None:
    _, _, record = await _failed_after_two_steps(MemoryStore())
    now = time.time()

    assert state_of(record, now) == "released"
    lines = "\n".join(record_lines(record, now))
    assert "state       released: a call failed after recording steps" in lines
    assert "(no owner)" in lines and "owner       -" in lines
    assert "lease end   ended at the release (no call holds the key)" in lines
    assert "steps       2 recorded: create_order (14 B), charge (result not stored)" in lines
    assert "resumes     a retry with the same payload resumes at step 3" in lines
    assert "ord_1" not in lines  # results only with --show-response

    shown = "\n".join(record_lines(record, now, show_response=True))
    assert 'step 1      create_order = {"id": "ord_1"}' in shown
    assert "step 2      charge = not stored: the step's result (dict) is not a JSON value" in shown

    as_json = record_json(record, now)
    assert as_json["state"] == "released" and as_json["owner"] is None
    assert as_json["step_count"] == 2
    assert as_json["steps"][0] == {"name": "create_order", "stored": True, "bytes": 14}
    assert as_json["steps"][1]["stored"] is False
    assert "not a JSON value" in as_json["steps"][1]["not_stored"]
    assert record_json(record, now, show_response=True)["steps"][0]["result"] == {"id": "ord_1"}
    assert record_row(record, now).split()[:4] == ["INPROGRESS", "released,", "progress", "kept,"]
    assert "2 steps" in record_row(record, now)


async def test_a_crashed_holder_is_told_apart_from_a_released_record() -> None:
    _, during, _ = await _failed_after_two_steps(MemoryStore())
    assert during is not None and during.owner is not None and during.lease_end is not None
    running, crashed = time.time(), during.lease_end + 5  # as read after its lease ended

    assert state_of(during, running) == "in_progress"
    assert "2 steps" in record_row(during, running)
    assert state_of(during, crashed) == "lapsed"
    lines = "\n".join(record_lines(during, crashed))
    assert "state       lapsed: the lease ended while the call held recorded steps" in lines
    assert f"owner       {during.owner}" in lines
    assert "resumes at step 3" in lines
    assert record_json(during, crashed)["state"] == "lapsed"


async def test_a_completed_record_holds_no_steps_and_records_without_steps_are_unchanged() -> None:
    store = MemoryStore()
    manager = Manager(store, Options(key_prefix="shop", event_key_jmespath="order_id"))

    async def place() -> str:
        await step("create_order", lambda: asyncio.sleep(0, {"id": "ord_2"}))
        await step("charge", lambda: asyncio.sleep(0, "unused"))
        return "done"

    assert await manager.execute(ORDER, place, timeout=30) == "done"
    record = (await store.get(manager.key_for(ORDER), now=time.time())).record
    assert record is not None and record.status is Status.COMPLETED
    now = time.time()
    assert not [line for line in record_lines(record, now) if line.startswith(("steps", "resumes"))]
    assert (record_json(record, now)["step_count"], record_json(record, now)["steps"]) == (
        None,
        None,
    )
    assert "steps" not in record_row(record, now)


def test_an_unreadable_step_list_is_shown_as_such() -> None:
    now = time.time()
    for steps, why in [
        ("[[1, 2]]", "step 1 is not [name, result]"),
        ('{"a": 1}', "not a list of steps"),
        ("[[", "not JSON"),
        ('[["a", 1, 2, 3]]', "step 1 is not [name, result] or [name, null, reason]"),
    ]:
        record = Record("k", Status.INPROGRESS, int(now) + 60, now + 30, None, "o", steps=steps)
        lines = "\n".join(record_lines(record, now))
        assert f"steps       unreadable: {why}" in lines
        assert "idempotency-async release" in lines
        assert record_json(record, now)["steps_unreadable"].startswith(why)
        assert "steps unreadable" in record_row(record, now)


# -------------------------------------------------------- the command, on shared stores


async def _command_shows_steps(store: Store, url: str) -> None:
    assert isinstance(store, RecordsSteps), f"{type(store).__name__} records steps"
    manager, _, _ = await _failed_after_two_steps(store)
    key = str(manager.key_for(ORDER))
    got, shown, listed = await asyncio.gather(
        cli("get", "--store", url, key),
        cli("get", "--store", url, key, "--json", "--show-response"),
        cli("list", "--store", url),
    )
    assert "released: a call failed after recording steps" in got.ok()
    assert "2 recorded: create_order (14 B), charge (result not stored)" in got.out
    record = json.loads(shown.ok())
    assert record["state"] == "released" and record["step_count"] == 2
    assert record["steps"][0]["result"] == {"id": "ord_1"}
    assert "released, progress kept, 2 steps" in listed.ok()


@pytest.mark.postgres
async def test_get_shows_steps_on_postgres(postgres_server: Any) -> None:
    from _postgres import fresh_table_name

    from idempotency_async.stores.postgres import PostgresStore, create_table

    table = fresh_table_name()
    await create_table(postgres_server.dsn, table=table)
    async with PostgresStore.from_url(postgres_server.dsn, table=table) as store:
        await _command_shows_steps(store, f"{postgres_server.dsn}?table={table}")


@pytest.mark.redis
async def test_get_shows_steps_on_redis(redis_server: Any) -> None:
    from idempotency_async.stores.redis import RedisStore

    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    async with RedisStore.from_url(redis_server.url, key_prefix=prefix) as store:
        await _command_shows_steps(store, f"{redis_server.url}/0?key_prefix={prefix}")


@pytest.mark.dynamodb
async def test_get_shows_steps_on_dynamodb(moto_endpoint: str) -> None:
    from urllib.parse import quote

    from _moto import REGION, open_client

    from idempotency_async.stores.dynamodb import DynamoDBStore, create_table

    table = f"cli-{uuid.uuid4().hex[:12]}"
    async with open_client(moto_endpoint) as client:
        await create_table(client, table)
        await _command_shows_steps(
            DynamoDBStore(client, table_name=table),
            f"dynamodb://{table}?region={REGION}&endpoint={quote(moto_endpoint, safe='')}",
        )
