"""End to end: an orders service built with this library charges through a payments
service built with it too, both on real loopback servers.  The orders service loses the
completion of its first run and runs again once the lease lapsed; the payments service
gets the same downstream key and replays its first answer: the charge ran once.

Orders run under Starlette (uvicorn) with the httpx hook, or aiohttp with the aiohttp
client middleware; payments always under Starlette (uvicorn).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.downstream import aiohttp_middleware, httpx_event_hook
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.integrations import aiohttp as aiohttp_idempotency
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Completion
from idempotency_async.stores.base import Written
from tests._http_apps import serve_asgi
from tests.support import Clock, RecordingStore

LEASE = 5.0  # the orders service's request_timeout: its lease


def _tenant(request: Any) -> str:
    return "shop"


class LosesFirstCompletion(RecordingStore):
    """The first completion write fails before it applies (G1(c)): the record stays in
    progress until its lease lapses, and a retry runs the work again."""

    async def complete(self, completion: Completion) -> Written:
        self.calls.append("complete")
        if self.calls.count("complete") == 1:
            raise StoreUnavailableError("complete: the write was lost (injected)")
        return await self.inner.complete(completion)


@dataclass
class Payments:
    """The downstream service: charges once per Idempotency-Key."""

    base_url: str = ""
    charges: list[dict[str, Any]] = field(default_factory=list)


def payments_app(payments: Payments, required: bool) -> Starlette:
    async def charge(request: Request) -> JSONResponse:
        body = await request.json()
        payments.charges.append(body)  # the side effect
        return JSONResponse({"charge": len(payments.charges), "amount": body["amount"]}, 201)

    return Starlette(
        routes=[Route("/charges", charge, methods=["POST"])],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                paths=["/charges"],
                required=required,  # True: a charge without a key is refused
                caller_scope=_tenant,
            )
        ],
    )


@dataclass
class Orders:
    base_url: str
    clock: Clock
    store: LosesFirstCompletion
    runs: list[str] = field(default_factory=list)


def orders_manager(clock: Clock, store: LosesFirstCompletion) -> Manager:
    return Manager(store, Options(clock=clock))


async def _charge_with_httpx(client: httpx.AsyncClient, payments: str, amount: int) -> Any:
    response = await client.post(f"{payments}/charges", json={"amount": amount})
    return response.status_code, response.headers.get("idempotent-replayed"), response.json()


@asynccontextmanager
async def starlette_orders(payments: str, hooked: bool) -> AsyncIterator[Orders]:
    clock, store = Clock(), LosesFirstCompletion(MemoryStore())
    hooks = [httpx_event_hook(hosts=["127.0.0.1"])] if hooked else []
    async with httpx.AsyncClient(event_hooks={"request": hooks}) as client:
        orders = Orders("", clock, store)

        async def create_order(request: Request) -> JSONResponse:
            body = await request.json()
            orders.runs.append(body["order"])
            status, replayed, charge = await _charge_with_httpx(client, payments, body["amount"])
            return JSONResponse({"status": status, "replayed": replayed, "charge": charge}, 201)

        app = Starlette(
            routes=[Route("/orders", create_order, methods=["POST"])],
            middleware=[
                Middleware(
                    IdempotencyMiddleware,
                    manager=orders_manager(clock, store),
                    paths=["/orders"],
                    required=True,
                    caller_scope=_tenant,
                    request_timeout=LEASE,
                )
            ],
        )
        async with serve_asgi(app) as base_url:
            orders.base_url = base_url
            yield orders


@asynccontextmanager
async def aiohttp_orders(payments: str, hooked: bool) -> AsyncIterator[Orders]:
    clock, store = Clock(), LosesFirstCompletion(MemoryStore())
    middlewares = [aiohttp_middleware(hosts=["127.0.0.1"])] if hooked else []
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        orders = Orders("", clock, store)

        async def create_order(request: web.Request) -> web.Response:
            body = await request.json()
            orders.runs.append(body["order"])
            charge_url = f"{payments}/charges"
            async with session.post(charge_url, json={"amount": body["amount"]}) as response:
                charge = await response.json()
                result = {
                    "status": response.status,
                    "replayed": response.headers.get("idempotent-replayed"),
                    "charge": charge,
                }
            return web.json_response(result, status=201)

        app = web.Application(
            middlewares=[
                aiohttp_idempotency.idempotency_middleware(
                    orders_manager(clock, store),
                    paths=["/orders"],
                    required=True,
                    caller_scope=_tenant,
                    request_timeout=LEASE,
                )
            ]
        )
        app.router.add_post("/orders", create_order)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            orders.base_url = f"http://127.0.0.1:{server.port}"
            yield orders
        finally:
            await server.close()


ORDERS = {"starlette+httpx": starlette_orders, "aiohttp+aiohttp": aiohttp_orders}


@pytest.fixture(params=sorted(ORDERS))
def orders_service(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return ORDERS[request.param]


async def _order_twice_across_a_lost_completion(
    orders_service: Callable[..., Any], hooked: bool
) -> tuple[Payments, Orders, list[httpx.Response]]:
    payments = Payments()
    answers: list[httpx.Response] = []
    async with AsyncExitStack() as stack:
        payments.base_url = await stack.enter_async_context(
            serve_asgi(payments_app(payments, hooked))
        )
        orders = await stack.enter_async_context(orders_service(payments.base_url, hooked))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=orders.base_url))
        request = {"json": {"order": "o-1", "amount": 1250}, "headers": {"Idempotency-Key": "k-1"}}
        # The first run charges; its completion is lost, so the orders record stays in
        # progress (its answer may or may not reach the client: it does not matter).
        answers.append(await client.post("/orders", **request))
        assert orders.store.calls.count("complete") == 1
        # The client retries once the orders lease lapsed (moved, not slept).
        orders.clock.advance(LEASE + 1)
        answers.append(await client.post("/orders", **request))
        # And again: the orders service now replays its own completed record.
        answers.append(await client.post("/orders", **request))
    return payments, orders, answers


async def test_a_rerun_after_a_lost_completion_is_deduplicated_downstream(
    orders_service: Callable[..., Any],
) -> None:
    payments, orders, answers = await _order_twice_across_a_lost_completion(
        orders_service, hooked=True
    )
    assert orders.runs == ["o-1", "o-1"]  # the orders service really ran twice
    assert payments.charges == [{"amount": 1250}]  # the charge ran once
    first = answers[0].json()
    assert first == {"status": 201, "replayed": None, "charge": {"charge": 1, "amount": 1250}}
    rerun = answers[1].json()
    assert answers[1].status_code == 201
    assert rerun == {"status": 201, "replayed": "true", "charge": {"charge": 1, "amount": 1250}}
    assert answers[2].json() == rerun
    assert answers[2].headers.get("idempotent-replayed") == "true"


async def test_without_the_hook_the_rerun_charges_twice(
    orders_service: Callable[..., Any],
) -> None:
    """The control: the same scenario without the hook (and a payments service that takes
    keyless charges) charges twice."""
    payments, orders, answers = await _order_twice_across_a_lost_completion(
        orders_service, hooked=False
    )
    assert orders.runs == ["o-1", "o-1"]
    assert payments.charges == [{"amount": 1250}, {"amount": 1250}]
    assert answers[1].json()["replayed"] is None
