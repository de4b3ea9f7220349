"""Pins the test kit's types: only type-checked (``mypy --strict tests/typing``), never run.

A build function returning what ``idempotent_function`` or ``idempotent_handler`` makes is
a target as it is, and a check returns its report.
"""

from __future__ import annotations

from typing import Any, assert_type

from idempotency_async import Manager, Options, Store, idempotent_function
from idempotency_async.decorators import IdempotentFunction
from idempotency_async.integrations.aws_lambda import idempotent_handler
from idempotency_async.testing.kit import (
    Call,
    KitReport,
    Scenario,
    Target,
    aiohttp_route,
    check_handler,
    function_handler,
    lambda_handler,
    replay,
    sqs_batch_handler,
)

DONE: list[dict[str, Any]] = []


async def charge(order: dict[str, Any]) -> dict[str, Any]:
    DONE.append(order)
    return order


def build(store: Store) -> IdempotentFunction[[dict[str, Any]], dict[str, Any]]:
    manager = Manager(store, Options(event_key_jmespath="id"))
    return idempotent_function(manager, payload="order", timeout=5)(charge)


async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return event


def build_lambda(store: Store) -> Any:
    return idempotent_handler(Manager(store))(handle)


def uses() -> None:
    target = function_handler(build)
    assert_type(target, Target)
    report = check_handler(target, payloads=[{"id": "a"}], effects=lambda: len(DONE))
    assert_type(report, KitReport)
    assert_type(report.seconds, float)
    replay(
        lambda_handler(build_lambda, timeout=3.0),
        Scenario({"id": "a"}, (Call(),)),
        effects=lambda: 0,
    )


async def handle_batch(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return {"batchItemFailures": []}


def build_batch(store: Store) -> Any:
    return handle_batch


def more_doors() -> None:
    batch = sqs_batch_handler(build_batch, timeout=5.0)
    assert_type(batch, Target)
    route = aiohttp_route(lambda store: None, "/orders", headers=[("X-API-Key", "a")])
    assert_type(route, Target)
    report = check_handler(batch, payloads=[{"id": "a"}], effects=lambda: 0, downstream=True)
    assert_type(report.mode, str)
