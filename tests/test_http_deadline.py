"""One request deadline: ``request_timeout`` counts from the request's arrival, reading its
body included, on plain routes as on transactional ones (real servers on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_async import Manager, MemoryStore
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.starlette import IdempotencyMiddleware

TIMEOUT = 0.5
# The client holds back the end of its body this long: past the request's deadline, so the
# deadline has passed before the key could be claimed (a busier machine only adds to it).
TRICKLE = TIMEOUT + 0.3


def _starlette(store: MemoryStore, runs: list[str]) -> AbstractAsyncContextManager[str]:
    async def orders(request: Request) -> JSONResponse:
        runs.append((await request.body()).decode())
        return JSONResponse({"ok": True}, status_code=201)

    app = Starlette(
        routes=[Route("/orders", orders, methods=["POST"])],
        middleware=[
            Middleware(IdempotencyMiddleware, manager=Manager(store), request_timeout=TIMEOUT)
        ],
    )
    return serve_asgi(app)


def _aiohttp(store: MemoryStore, runs: list[str]) -> AbstractAsyncContextManager[str]:
    async def orders(request: web.Request) -> web.Response:
        runs.append(await request.text())
        return web.json_response({"ok": True}, status=201)

    app = web.Application(
        middlewares=[idempotency_middleware(Manager(store), request_timeout=TIMEOUT)]
    )
    app.router.add_post("/orders", orders)
    return serve_aio(app)


SERVE: dict[str, Callable[[MemoryStore, list[str]], AbstractAsyncContextManager[str]]] = {
    "starlette": _starlette,
    "aiohttp": _aiohttp,
}


async def _trickled() -> AsyncIterator[bytes]:
    yield b'{"sku": '
    await asyncio.sleep(TRICKLE)
    yield b'"a"}'


@pytest.mark.parametrize("server", sorted(SERVE))
async def test_a_body_read_past_the_deadline_is_504_and_never_claimed(server: str) -> None:
    store = MemoryStore()
    runs: list[str] = []
    async with SERVE[server](store, runs) as base_url, httpx.AsyncClient() as client:
        response = await client.post(
            f"{base_url}/orders",
            content=_trickled(),
            headers={"Idempotency-Key": "k1", "Content-Type": "application/json"},
            timeout=30,
        )
    assert response.status_code == 504, response.text
    assert runs == []  # the endpoint never ran
    assert len(store) == 0  # the deadline passed before the claim: the store saw nothing
