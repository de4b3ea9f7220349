"""The users' test kit (``idempotency_async.testing.kit``) on the project's examples, written
only with the kit: the Lambda SQS batch handler (``examples/lambda/sqs_handler.py``), the
aiohttp app (``examples/aiohttp_app.py``, on the kit's store and on a real Redis), the
FastAPI + Redis app (``examples/redis_app.py``, on a real Redis), the
FastAPI + SQLAlchemy transactional route (``examples/fastapi_sqlalchemy.py``, on a real
PostgreSQL) and downstream keys (``docs/downstream.md``) each pass it; a deliberately
broken variant of each is caught, shrunk, and printed as the guide shows it."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import Response

from idempotency_async import Manager, Options, downstream_key, idempotent_function
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.integrations.fastapi import IdempotentTransaction
from idempotency_async.stores.base import Store
from idempotency_async.testing.kit import (
    BatchItemFailed,
    Call,
    HandlerCheckFailed,
    Scenario,
    aiohttp_route,
    asgi_route,
    check_handler,
    function_handler,
    replay,
    sqs_batch_handler,
)

ROOT = Path(__file__).parents[1]
GUIDE = ROOT / "docs" / "testing-your-handler.md"
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "examples" / "lambda"))


def _import_sqs_example() -> Any:
    # The example builds its DynamoDB store at import (no connection until a call).
    saved = os.environ.get("IDEMPOTENCY_TABLE")
    os.environ["IDEMPOTENCY_TABLE"] = "unused-by-the-kit"
    try:
        return importlib.import_module("sqs_handler")
    finally:
        if saved is None:
            del os.environ["IDEMPOTENCY_TABLE"]
        else:
            os.environ["IDEMPOTENCY_TABLE"] = saved


sqs_handler = _import_sqs_example()
import aiohttp_app  # noqa: E402


def _caught(target: Any, effects: Any, payloads: Any, **options: Any) -> HandlerCheckFailed:
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(target, payloads=payloads, effects=effects, **options)
    return caught.value


def _reruns(failure: HandlerCheckFailed) -> None:
    """The printed reproducer is Python that fails again, the same way."""
    code = str(failure).split("shrunk reproducer:\n\n", 1)[1]
    with pytest.raises(HandlerCheckFailed) as again:
        exec(textwrap.dedent(code), {})
    assert again.value.violations[0].split(":")[0] == failure.violations[0].split(":")[0]


def _guide_block(title: str) -> str:
    match = re.search(
        rf'^```\w* title="{re.escape(title)}"\n(.*?)^```$', GUIDE.read_text(), re.S | re.M
    )
    assert match is not None, f"docs/testing-your-handler.md has no block titled {title!r}"
    return match[1].rstrip("\n")


def _as_in_the_guide(failure: HandlerCheckFailed, title: str) -> None:
    shown = _guide_block(title)
    assert shown.split("shrunk reproducer:")[1] == str(failure).split("shrunk reproducer:")[1]


# -- The Lambda SQS batch handler (examples/lambda/sqs_handler.py) ---------------------------


def shipped() -> int:
    return len(sqs_handler.shipped)


def build_sqs_handler(store: Store) -> Any:
    # The example's handler, its options and its record handler, on the kit's store.
    manager = Manager(store, sqs_handler.manager.options)

    async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return await process_batch(manager, event, sqs_handler.ship, context=context)

    return handle


def build_sqs_handler_shipping_first(store: Store) -> Any:
    manager = Manager(store, sqs_handler.manager.options)

    async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        for record in event["Records"]:
            # Broken: ships before the idempotent call, so every redelivery ships again.
            await sqs_handler.ship({**record, "body": json_body(record)})
        return await process_batch(manager, event, sqs_handler.ship, context=context)

    return handle


def json_body(record: dict[str, Any]) -> Any:
    import json

    return json.loads(record["body"])


ORDERS = [{"order_id": "o-1", "quantity": 2}, {"order_id": "o-2", "quantity": 1}]


def test_sqs_batch_example_passes_the_kit() -> None:
    report = check_handler(
        sqs_batch_handler(build_sqs_handler, timeout=5.0), payloads=ORDERS, effects=shipped
    )
    assert report.mode == "lease"
    assert report.payloads == 2
    assert report.seconds < 10


def test_sqs_batch_example_passes_with_the_message_twice_in_each_batch() -> None:
    # The second delivery joins the first inside process_batch: one shipment per call.
    target = sqs_batch_handler(build_sqs_handler, timeout=5.0, copies=2)
    report = check_handler(target, payloads=ORDERS[:1], effects=shipped)
    assert report.mode == "lease"


def test_kit_catches_an_sqs_handler_shipping_before_the_idempotent_call() -> None:
    target = sqs_batch_handler(build_sqs_handler_shipping_first, timeout=5.0)
    failure = _caught(target, shipped, ORDERS)
    assert failure.violations[0].startswith("effect before the claim")
    assert failure.scenario.calls == (Call(),)
    _reruns(failure)
    _as_in_the_guide(failure, "sqs: effect before the claim")


def test_a_failed_message_is_batch_item_failed_for_the_caller() -> None:
    # A message the example refuses (no items) is named in batchItemFailures.
    scenario = Scenario({"order_id": "o-3", "quantity": 0}, (Call(), Call()))
    replay(sqs_batch_handler(build_sqs_handler), scenario, effects=shipped)
    with pytest.raises(HandlerCheckFailed, match="no call answered"):
        check_handler(
            sqs_batch_handler(build_sqs_handler),
            payloads=[{"order_id": "o-3", "quantity": 0}],
            effects=shipped,
        )
    assert issubclass(BatchItemFailed, Exception)


# -- The aiohttp app (examples/aiohttp_app.py) ------------------------------------------------


def aiohttp_orders() -> int:
    # The example's own effect: each created order takes the next id from its counter.
    return int(repr(aiohttp_app._order_ids)[len("count(") : -1]) - 1


def build_aiohttp_app(store: Store, *, marked: bool = True, lease: float = 30.0) -> Any:
    # The example's make_app, on the kit's store.
    from aiohttp import web

    from idempotency_async.integrations.aiohttp import idempotency_middleware

    middleware = idempotency_middleware(
        Manager(store, Options(key_prefix="orders-api")),
        paths=(),
        required=True,
        caller_scope=aiohttp_app.caller,
        request_timeout=lease,
    )
    app = web.Application(middlewares=[middleware])
    # Broken when not marked: the example's handler without @idempotent_endpoint, which
    # the middleware (paths=()) then passes through: every duplicate creates an order.
    # (A marked handler wrapped in an unmarked one is refused by the library: a 500.)
    handler = aiohttp_app.create_order if marked else aiohttp_app.create_order.__wrapped__
    app.router.add_post("/orders", handler)
    return app


def build_unmarked_aiohttp_app(store: Store) -> Any:
    return build_aiohttp_app(store, marked=False)


BODIES = [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 1}]
API_KEY = [("X-API-Key", "alice")]


def test_aiohttp_example_passes_the_kit() -> None:
    route = aiohttp_route(build_aiohttp_app, "/orders", headers=API_KEY)
    report = check_handler(route, payloads=BODIES, effects=aiohttp_orders)
    assert report.mode == "lease"
    assert report.seconds < 15


def test_kit_catches_an_aiohttp_route_the_middleware_does_not_cover() -> None:
    route = aiohttp_route(build_unmarked_aiohttp_app, "/orders", headers=API_KEY)
    failure = _caught(route, aiohttp_orders, BODIES)
    assert failure.violations[0].startswith("effect without a claim")
    _reruns(failure)
    _as_in_the_guide(failure, "aiohttp: effect without a claim")


def build_aiohttp_app_short_lease(store: Store) -> Any:
    # In real time (a real store) a retry after the lease really waits: a short lease.
    return build_aiohttp_app(store, lease=0.3)


REDIS: dict[str, str] = {}


def make_redis_store() -> Store:
    from idempotency_async.stores.redis import RedisStore

    return RedisStore.from_url(REDIS["url"], key_prefix=REDIS["prefix"])


@pytest.fixture
def kit_redis(redis_server: Any) -> None:
    REDIS["url"], REDIS["prefix"] = redis_server.url, f"kit-{uuid.uuid4().hex[:8]}:"


@pytest.mark.redis
@pytest.mark.usefixtures("kit_redis")
def test_aiohttp_example_passes_the_kit_on_a_real_redis() -> None:
    route = aiohttp_route(build_aiohttp_app_short_lease, "/orders", headers=API_KEY)
    report = check_handler(
        route, payloads=BODIES[:1], effects=aiohttp_orders, store=make_redis_store, crash_points=4
    )
    assert report.mode == "lease"
    assert report.seconds < 15


def build_unmarked_aiohttp_app_short_lease(store: Store) -> Any:
    return build_aiohttp_app(store, marked=False, lease=0.3)


@pytest.mark.redis
@pytest.mark.usefixtures("kit_redis")
def test_kit_catches_the_unmarked_aiohttp_route_on_a_real_redis() -> None:
    route = aiohttp_route(build_unmarked_aiohttp_app_short_lease, "/orders", headers=API_KEY)
    failure = _caught(route, aiohttp_orders, BODIES[:1], store=make_redis_store, crash_points=4)
    assert failure.violations[0].startswith("effect without a claim")
    assert "store=test_testing_kit_examples.make_redis_store" in str(failure)


# -- Downstream keys (docs/downstream.md) ----------------------------------------------------

PROVIDER: dict[str, dict[str, Any]] = {}
"""A payments provider that honours Idempotency-Key: the charges it applied, by key."""


def provider_charges() -> int:
    return len(PROVIDER)


async def provider_charge(order: dict[str, Any], key: str) -> str:
    await asyncio.sleep(0.01)  # the request on its way
    charge = PROVIDER.setdefault(key, {"id": f"ch_{len(PROVIDER) + 1}", **order})
    await asyncio.sleep(0.01)  # the answer on its way back
    return str(charge["id"])


def build_downstream(store: Store, *, random_key: bool = False) -> Any:
    manager = Manager(store, Options(key_prefix="orders", event_key_jmespath="order_id"))

    async def charge(order: dict[str, Any]) -> dict[str, Any]:
        # Broken with random_key: a new key per run, which the provider cannot deduplicate.
        key = uuid.uuid4().hex if random_key else downstream_key("charge")
        return {"order": order["order_id"], "charge": await provider_charge(order, key)}

    return idempotent_function(manager, payload="order", timeout=10)(charge)


def build_downstream_with_random_key(store: Store) -> Any:
    return build_downstream(store, random_key=True)


CHARGE_ORDERS = [{"order_id": "o-1", "amount": 5}]


def test_downstream_keys_pass_the_kit_in_downstream_mode() -> None:
    report = check_handler(
        function_handler(build_downstream),
        payloads=CHARGE_ORDERS,
        effects=provider_charges,
        downstream=True,
    )
    assert report.mode == "downstream keys"


def test_kit_catches_a_random_key_sent_downstream() -> None:
    failure = _caught(
        function_handler(build_downstream_with_random_key),
        provider_charges,
        CHARGE_ORDERS,
        downstream=True,
    )
    assert failure.violations[0].startswith("effect repeated downstream")
    assert any(call.cancel_at for call in failure.scenario.calls)
    _reruns(failure)
    _as_in_the_guide(failure, "downstream: effect repeated downstream")


def test_a_random_key_passes_lease_mode_which_allows_a_rerun_after_a_crash() -> None:
    # Without downstream=True the kit judges lease mode, where a crash may repeat an effect.
    check_handler(
        function_handler(build_downstream_with_random_key),
        payloads=CHARGE_ORDERS,
        effects=provider_charges,
    )


# -- FastAPI + SQLAlchemy, transactional (examples/fastapi_sqlalchemy.py) ---------------------

sqlalchemy_example: Any = None
"""The example module, imported by the fixture once the PostgreSQL server runs (it reads
DATABASE_URL and its table names at import)."""
PG: dict[str, str] = {}


@pytest.fixture
def sqlalchemy_tables(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    global sqlalchemy_example
    if sqlalchemy_example is None:
        suffix = uuid.uuid4().hex[:8]
        monkeypatch.setenv("DATABASE_URL", postgres_server.dsn)
        monkeypatch.setenv("IDEMPOTENCY_TABLE", f"idem_kit_{suffix}")
        monkeypatch.setenv("ORDERS_TABLE", f"orders_kit_{suffix}")
        sqlalchemy_example = importlib.import_module("fastapi_sqlalchemy")
        PG.update(dsn=postgres_server.dsn, orders=f"orders_kit_{suffix}")
        asyncio.run(_create_tables())
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
    from sqlalchemy.pool import NullPool

    # Each kit scenario runs on a loop of its own: no pooled connection may outlive one.
    url = PG["dsn"].replace("postgres://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url, poolclass=NullPool)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    monkeypatch.setattr(sqlalchemy_example, "Session", sessions)


async def _create_tables() -> None:
    from idempotency_async.stores.postgres import create_table

    example = sqlalchemy_example
    await create_table(PG["dsn"], table=example.TABLE)
    async with example.engine.begin() as connection:
        await connection.run_sync(example.Base.metadata.create_all)
    await example.engine.dispose()


def committed_orders() -> int:
    import psycopg

    with psycopg.connect(PG["dsn"], autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {PG['orders']}").fetchone()
        assert row is not None
        return int(row[0])


def make_postgres_store() -> Store:
    from idempotency_async.stores.postgres import PostgresStore

    return PostgresStore.from_url(PG["dsn"], table=sqlalchemy_example.TABLE)


def build_sqlalchemy_app(store: Store, *, route: Any = None) -> Any:
    # The example's app, on the kit's store, with a short lease (real time).
    from fastapi import FastAPI

    from idempotency_async import Wait
    from idempotency_async.integrations.starlette import IdempotencyMiddleware

    example = sqlalchemy_example
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(store, Options(key_prefix="orders-api")),
        paths=(),
        caller_scope=example.caller,
        wait=Wait(timeout=10.0),
        request_timeout=2.0,
    )
    endpoint = route or example.create_order
    app.post("/orders", status_code=201, response_model=example.Created)(endpoint)
    return app


async def create_order_writing_outside(
    order: sqlalchemy_example.Order,
    tx: IdempotentTransaction,
    response: Response,
) -> Response:
    example = sqlalchemy_example
    async with example.Session() as session, session.begin():

        async def work() -> Any:
            order_id = f"ord_{uuid.uuid4().hex[:12]}"
            # Broken: the order is written in a session of its own, committed at once, not
            # in the transaction that records the response: a rollback keeps it.
            async with example.Session() as other, other.begin():
                other.add(example.OrderRow(id=order_id, sku=order.sku, qty=order.qty))
            await asyncio.sleep(0.01)
            return example.Created(id=order_id, sku=order.sku, qty=order.qty)

        answer: Response = await tx.run(session, work)
    return answer


def build_sqlalchemy_app_writing_outside(store: Store) -> Any:
    return build_sqlalchemy_app(store, route=create_order_writing_outside)


@pytest.mark.postgres
@pytest.mark.usefixtures("sqlalchemy_tables")
def test_sqlalchemy_example_passes_the_kit_in_transactional_mode() -> None:
    route = asgi_route(build_sqlalchemy_app, "/orders", headers=API_KEY)
    report = check_handler(
        route,
        payloads=[{"sku": "A1", "qty": 2}],
        effects=committed_orders,
        store=make_postgres_store,
        crash_points=6,
    )
    assert report.mode == "transactional"
    assert report.seconds < 15


@pytest.mark.postgres
@pytest.mark.usefixtures("sqlalchemy_tables")
def test_kit_catches_the_sqlalchemy_route_writing_outside_its_transaction() -> None:
    route = asgi_route(build_sqlalchemy_app_writing_outside, "/orders", headers=API_KEY)
    failure = _caught(
        route,
        committed_orders,
        [{"sku": "A1", "qty": 2}],
        store=make_postgres_store,
        crash_points=6,
    )
    assert failure.violations[0].startswith("effect committed twice")
    assert any(call.cancel_at for call in failure.scenario.calls)
    _reruns(failure)
    # The await a crash needs depends on the driver's round trips: the guide's number may
    # differ from this machine's.
    shown, printed = _guide_block("sqlalchemy: effect committed twice"), str(failure)
    assert re.sub(r"(#|cancel_at=)\d+", r"\1N", shown) == re.sub(
        r"(#|cancel_at=)\d+", r"\1N", printed
    )


async def ship_ignoring_cancellation(record: dict[str, Any]) -> dict[str, Any]:
    # Broken: the warehouse call carries on when the record's task is cancelled.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.05)
    return await sqs_handler.ship(record)


def build_sqs_handler_ignoring_cancellation(store: Store) -> Any:
    manager = Manager(store, sqs_handler.manager.options)

    async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return await process_batch(manager, event, ship_ignoring_cancellation, context=context)

    return handle


def test_the_kit_cancels_the_record_task_at_its_awaits() -> None:
    # The crash lands in the task process_batch runs the record in, inside the handler.
    target = sqs_batch_handler(build_sqs_handler_ignoring_cancellation)
    failure = _caught(target, shipped, ORDERS[:1])
    assert failure.violations[0].startswith("effect after cancellation")
    assert failure.scenario.calls[0].cancel_at is not None


# -- The FastAPI + Redis example (examples/redis_app.py), on a real Redis ---------------------

REDIS_ORDER_IDS: list[str] = []


class _CountedIds:
    """The example's id source, counted: each created order takes one fresh id."""

    @staticmethod
    def uuid4() -> uuid.UUID:
        made = uuid.uuid4()
        REDIS_ORDER_IDS.append(made.hex)
        return made


def redis_orders() -> int:
    return len(REDIS_ORDER_IDS)


def build_redis_app(store: Store) -> Any:
    # The example's app and route, on the kit's store, with a short lease (real time).
    from fastapi import FastAPI

    from idempotency_async.integrations.starlette import IdempotencyMiddleware

    redis_app = importlib.import_module("redis_app")
    redis_app.uuid = _CountedIds
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(store, Options(key_prefix="orders-api")),
        paths=(),
        required=True,
        caller_scope=redis_app.caller,
        request_timeout=0.3,
    )
    app.post("/orders", status_code=201)(redis_app.create_order)
    return app


@pytest.mark.redis
@pytest.mark.usefixtures("kit_redis")
def test_redis_example_passes_the_kit_on_a_real_redis() -> None:
    route = asgi_route(build_redis_app, "/orders", headers=API_KEY)
    report = check_handler(
        route, payloads=BODIES[:1], effects=redis_orders, store=make_redis_store, crash_points=4
    )
    assert report.mode == "lease"
    assert report.seconds < 15
