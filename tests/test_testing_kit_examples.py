"""The users' test kit (``idempotency_async.testing.kit``) on the project's examples, written
only with the kit: the Lambda SQS batch handler (``examples/lambda/sqs_handler.py``), the
aiohttp app (``examples/aiohttp_app.py``, on the kit's store and on a real Redis), the
FastAPI + SQLAlchemy transactional route (``examples/fastapi_sqlalchemy.py``, on a real
PostgreSQL) and downstream keys (``docs/downstream.md``) each pass it; a deliberately
broken variant of each is caught, shrunk, and printed as the guide shows it."""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from idempotency_async import Manager, Options, downstream_key, idempotent_function
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.stores.base import Store
from idempotency_async.testing.kit import (
    BatchItemFailed,
    Call,
    HandlerCheckFailed,
    Scenario,
    aiohttp_route,
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
