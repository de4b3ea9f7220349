"""One manager derivation for every integration: owned options, kept options, reachable."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_async import LocalCache, Manager, MemoryStore, Options, idempotent_function
from idempotency_async.errors import ConfigError
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.options import Wait
from idempotency_async.stores.base import Found, Store


class _Codec:
    def encode(self, value: Any) -> Any:
        return value

    def decode(self, value: Any) -> Any:
        return value


OWNED: dict[str, Any] = {
    "event_key_jmespath": "order_id",
    "payload_validation_jmespath": "amount",
    "serialize_key": str,
    "response_codec": _Codec(),
    "response_hook": lambda response, record: response,
}


@pytest.mark.parametrize("name", sorted(OWNED))
def test_http_middleware_refuses_options_it_owns(name: str) -> None:
    manager = Manager(MemoryStore(), Options(**{name: OWNED[name]}))
    with pytest.raises(ConfigError, match=name):
        IdempotencyMiddleware(Starlette(), manager=manager)
    with pytest.raises(ConfigError, match=name):
        idempotency_middleware(manager)


def test_http_middleware_keeps_every_other_option() -> None:
    options = Options(
        key_prefix="orders-api",
        expires_after=60,
        local_cache=LocalCache(),
        wait=Wait(timeout=3.0),
        lease_margin=1,
    )
    middleware = IdempotencyMiddleware(Starlette(), manager=Manager(MemoryStore(), options))
    kept = middleware.manager.options
    assert (kept.key_prefix, kept.expires_after) == ("orders-api", 60)
    assert (kept.local_cache, kept.wait, kept.lease_margin) == (LocalCache(), Wait(timeout=3.0), 1)
    assert kept.event_key_jmespath == "scope"
    # The middleware's own wait arguments adjust what the manager has.
    aio = idempotency_middleware(Manager(MemoryStore(), options), wait=False)
    assert aio.manager.options.wait is None  # type: ignore[attr-defined]
    aio = idempotency_middleware(Manager(MemoryStore(), options), wait=Wait(timeout=1.0))
    assert aio.manager.options.wait == Wait(timeout=1.0)  # type: ignore[attr-defined]


async def _orders(request: Request) -> JSONResponse:
    request.app.state.runs += 1
    return JSONResponse({"run": request.app.state.runs}, status_code=201)


@pytest.mark.parametrize("framework", ["starlette", "aiohttp"])
async def test_middleware_key_for_is_the_stored_key(framework: str, store: Store) -> None:
    runs = {"count": 0}
    if framework == "starlette":
        app = Starlette(routes=[Route("/orders/{order_id}", _orders, methods=["POST"])])
        app.state.runs = 0
        middleware: Any = IdempotencyMiddleware(app, manager=Manager(store))
        served = serve_asgi(middleware)
    else:

        async def orders(request: web.Request) -> web.Response:
            runs["count"] += 1
            return web.json_response({"run": runs["count"]}, status=201)

        middleware = idempotency_middleware(Manager(store))
        aio = web.Application(middlewares=[middleware])
        aio.router.add_post("/orders/{order_id}", orders)
        served = serve_aio(aio)
    async with served as base_url, httpx.AsyncClient(base_url=base_url) as client:
        first = await client.post("/orders/7", headers={"Idempotency-Key": "k-1"})
        key = middleware.key_for("POST", "/orders/{order_id}", "k-1")
        verdict = await store.get(key, now=time.time())
        assert verdict.found is Found.COMPLETED
        await middleware.manager.force_release(key)
        again = await client.post("/orders/7", headers={"Idempotency-Key": "k-1"})
    assert first.json() == {"run": 1} and again.json() == {"run": 2}


async def test_decorated_function_exposes_the_manager_it_runs(store: Store) -> None:
    manager = Manager(store)

    @idempotent_function(manager, payload="order")
    async def charge(order: dict[str, int]) -> int:
        return order["amount"]

    await charge({"amount": 5})
    derived = charge.manager
    assert derived is not manager and derived.key_prefix.endswith("charge")
    key = derived.key_for({"amount": 5})
    assert manager.key_for({"amount": 5}) != key  # the given manager keys differently
    assert (await store.get(key, now=time.time())).found is Found.COMPLETED
