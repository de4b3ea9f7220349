"""The same small API served by FastAPI (uvicorn) and aiohttp, for the HTTP behaviour suite.

Routes (all counting handler runs in ``calls``, keyed by ``<route>:<tenant>:<key>``):

- ``POST /orders/{order_id}``  opt-in; body ``{"sku": str, "delay": float}``; 201 with
  Location, Set-Cookie and a per-run ``X-Run`` header
- ``POST /flaky/{mode}``       opt-in; first run raises (``raise``) or answers 503 (``503``;
  500 with ``500``)
- ``POST /stream``             opt-in; streams ``?chunks=`` chunks of 1,000 bytes
- ``POST /big``                opt-in; 100,000 bytes with a Content-Length
- ``POST /legacy``             no opt-in: idempotent through the ``paths`` pattern
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from aiohttp import web
from aiohttp.test_utils import TestServer
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from idempotency_async import Manager, MemoryStore, Wait
from idempotency_async.integrations.aiohttp import (
    idempotency_middleware,
    idempotent_endpoint,
    request_state,
)
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware

MAX_BODY = 4096
MAX_RESPONSE = 64 * 1024
REQUEST_TIMEOUT = 5.0
BIG = 100_000


@dataclass
class Served:
    base_url: str
    calls: Counter[str] = field(default_factory=Counter)


def _tenant(request: Any) -> str | None:
    value = request.headers.get("x-tenant")
    return None if value is None else str(value)


def _options(wait: float | None) -> dict[str, Any]:
    return {
        "paths": ["/legacy"],
        "required": True,
        "caller_scope": _tenant,
        "request_timeout": REQUEST_TIMEOUT,
        "max_body_bytes": MAX_BODY,
        "max_response_bytes": MAX_RESPONSE,
        **({"wait": Wait(timeout=wait)} if wait else {}),
    }


def _chunk(index: int) -> bytes:
    return f"{index:04d}".encode() * 250


class _Order(BaseModel):
    sku: str
    delay: float = 0.0


def _order_result(calls: Counter[str], name: str, order_id: str, sku: str) -> dict[str, Any]:
    calls[name] += 1
    return {"order_id": order_id, "sku": sku, "run": sum(calls.values())}


# ---------------------------------------------------------------------- FastAPI


def fastapi_app(calls: Counter[str], *, wait: float | None, store: Any = None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware, manager=Manager(store or MemoryStore()), **_options(wait)
    )

    def name(route: str, request: Request, key: str | None) -> str:
        return f"{route}:{_tenant(request)}:{key}"

    @app.post("/orders/{order_id}", status_code=201)
    async def create_order(
        order_id: str, order: _Order, request: Request, response: Response, key: IdempotencyKey
    ) -> dict[str, Any]:
        await asyncio.sleep(order.delay)
        result = _order_result(calls, name("orders", request, key), order_id, order.sku)
        response.headers["location"] = f"/orders/{order_id}"
        response.headers["x-run"] = str(result["run"])
        response.set_cookie("session", f"run-{result['run']}")
        return result

    @app.post("/flaky/{mode}", status_code=201)
    async def flaky(mode: str, request: Request, key: IdempotencyKey) -> Response:
        label = name(f"flaky-{mode}", request, key)
        calls[label] += 1
        if calls[label] == 1 and mode == "raise":
            raise RuntimeError("first attempt fails")
        if calls[label] == 1:
            # A status in the path (e.g. /flaky/429), else 503.
            status = int(mode) if mode.isdigit() else 503
            return JSONResponse({"error": "unavailable"}, status_code=status)
        if mode == "http":
            raise HTTPException(409, "rejected by the endpoint")
        return JSONResponse({"attempt": calls[label]}, status_code=201)

    @app.post("/stream")
    async def stream(request: Request, key: IdempotencyKey, chunks: int = 5) -> Response:
        calls[name("stream", request, key)] += 1

        async def produce() -> AsyncIterator[bytes]:
            for index in range(chunks):
                yield _chunk(index)
                await asyncio.sleep(0)

        return StreamingResponse(produce(), media_type="text/plain")

    @app.post("/big")
    async def big(request: Request, key: IdempotencyKey) -> Response:
        calls[name("big", request, key)] += 1
        return Response(b"b" * BIG, media_type="application/octet-stream")

    @app.post("/legacy", status_code=201)
    async def legacy(request: Request) -> dict[str, int]:
        calls["legacy"] += 1
        return {"run": calls["legacy"]}

    return app


@asynccontextmanager
async def serve_fastapi(wait: float | None, store: Any = None) -> AsyncIterator[Served]:
    served = Served("")
    async with serve_asgi(fastapi_app(served.calls, wait=wait, store=store)) as base_url:
        served.base_url = base_url
        yield served


@asynccontextmanager
async def serve_asgi(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="critical", lifespan="off", ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


# ---------------------------------------------------------------------- aiohttp


def aiohttp_app(calls: Counter[str], *, wait: float | None, store: Any = None) -> web.Application:
    app = web.Application(
        middlewares=[idempotency_middleware(Manager(store or MemoryStore()), **_options(wait))]
    )

    def name(route: str, request: web.Request) -> str:
        state = request_state(request)
        return f"{route}:{_tenant(request)}:{None if state is None else state.key}"

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("sku"), str):
            raise web.HTTPUnprocessableEntity(text="sku is required")
        await asyncio.sleep(float(body.get("delay", 0)))
        order_id = request.match_info["order_id"]
        result = _order_result(calls, name("orders", request), order_id, body["sku"])
        response = web.json_response(result, status=201)
        response.headers["Location"] = f"/orders/{order_id}"
        response.headers["X-Run"] = str(result["run"])
        response.set_cookie("session", f"run-{result['run']}")
        return response

    @idempotent_endpoint
    async def flaky(request: web.Request) -> web.Response:
        mode = request.match_info["mode"]
        label = name(f"flaky-{mode}", request)
        calls[label] += 1
        if calls[label] == 1 and mode == "raise":
            raise RuntimeError("first attempt fails")
        if calls[label] == 1:
            # A status in the path (e.g. /flaky/429), else 503.
            status = int(mode) if mode.isdigit() else 503
            return web.json_response({"error": "unavailable"}, status=status)
        if mode == "http":
            raise web.HTTPConflict(text="rejected by the endpoint")
        return web.json_response({"attempt": calls[label]}, status=201)

    @idempotent_endpoint
    async def stream(request: web.Request) -> web.StreamResponse:
        calls[name("stream", request)] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        for index in range(int(request.query.get("chunks", "5"))):
            await response.write(_chunk(index))
            await asyncio.sleep(0)
        return response

    @idempotent_endpoint
    async def big(request: web.Request) -> web.Response:
        calls[name("big", request)] += 1
        return web.Response(body=b"b" * BIG, content_type="application/octet-stream")

    async def legacy(request: web.Request) -> web.Response:
        calls["legacy"] += 1
        return web.json_response({"run": calls["legacy"]}, status=201)

    app.router.add_post("/orders/{order_id}", create_order)
    app.router.add_post("/flaky/{mode}", flaky)
    app.router.add_post("/stream", stream)
    app.router.add_post("/big", big)
    app.router.add_post("/legacy", legacy)
    return app


@asynccontextmanager
async def serve_aiohttp(wait: float | None, store: Any = None) -> AsyncIterator[Served]:
    served = Served("")
    async with serve_aio(aiohttp_app(served.calls, wait=wait, store=store)) as base_url:
        served.base_url = base_url
        yield served


@asynccontextmanager
async def serve_aio(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp app on a free loopback port; yields its base URL."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


SERVERS = {"fastapi": serve_fastapi, "aiohttp": serve_aiohttp}
