"""The HTTP response lifecycle: once a response has started, nothing leads to a second run.

Each case runs through a real server (uvicorn + FastAPI, aiohttp) on each real store
(MemoryStore, DynamoDB on a moto server).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.responses import StreamingResponse
from support import on_stores

from idempotency_async import Manager
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.base import Store

TIMEOUT = 1.0
SLOW_BYTES = 8 * 1024 * 1024
CHUNK = 64 * 1024


def _options() -> dict[str, Any]:
    return {"paths": (), "required": True, "request_timeout": TIMEOUT}


async def _chunks(count: int, pause: float, size: int = CHUNK) -> AsyncIterator[bytes]:
    for index in range(count):
        yield bytes([65 + index % 26]) * size
        await asyncio.sleep(pause)


def fastapi_app(store: Store, calls: Counter[str], finished: list[str]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, manager=Manager(store), **_options())

    @app.post("/background")
    async def background(
        request: Request,
        tasks: BackgroundTasks,
        key: IdempotencyKey,
        delay: float = 0.0,
        fail: bool = False,
    ) -> dict[str, int]:
        calls[key] += 1

        async def after() -> None:
            await asyncio.sleep(delay)
            finished.append(key)
            if fail:
                raise RuntimeError("the background task failed")

        tasks.add_task(after)
        return {"run": calls[key]}

    @app.post("/slow")
    async def slow(key: IdempotencyKey, delay: float = 0.0) -> dict[str, int]:
        calls[key] += 1
        await asyncio.sleep(delay)
        return {"run": calls[key]}

    @app.post("/stream")
    async def stream(
        key: IdempotencyKey, count: int = 8, pause: float = 0.0, size: int = CHUNK
    ) -> Any:
        calls[key] += 1
        return StreamingResponse(_chunks(count, pause, size), media_type="application/octet-stream")

    return app


def aiohttp_app(store: Store, calls: Counter[str], finished: list[str]) -> web.Application:
    app = web.Application(middlewares=[idempotency_middleware(Manager(store), **_options())])

    @idempotent_endpoint
    async def stream(request: web.Request) -> web.StreamResponse:
        key = request.headers["Idempotency-Key"]
        calls[key] += 1
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        query = request.query
        count, pause = int(query.get("count", 8)), float(query.get("pause", 0))
        async for chunk in _chunks(count, pause, int(query.get("size", CHUNK))):
            await response.write(chunk)
        finished.append(key)
        return response

    @idempotent_endpoint
    async def slow(request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        calls[key] += 1
        await asyncio.sleep(float(request.query.get("delay", 0)))
        return web.json_response({"run": calls[key]})

    app.router.add_post("/stream", stream)
    app.router.add_post("/slow", slow)
    return app


class Served:
    def __init__(self, base_url: str, calls: Counter[str], finished: list[str]) -> None:
        self.base_url = base_url
        self.calls = calls
        self.finished = finished

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=30)


def _server(framework: str, store: Store) -> AbstractAsyncContextManager[Served]:
    @asynccontextmanager
    async def serve() -> AsyncIterator[Served]:
        calls: Counter[str] = Counter()
        finished: list[str] = []
        if framework == "fastapi":
            context = serve_asgi(fastapi_app(store, calls, finished))
        else:
            context = serve_aio(aiohttp_app(store, calls, finished))
        async with context as base_url:
            yield Served(base_url, calls, finished)

    return serve()


Start = Callable[[str], AbstractAsyncContextManager[Served]]


@pytest.fixture
def start(store: Store) -> Start:
    return lambda framework: _server(framework, store)


def _headers(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


# ---------------------------------------------------------------------- background tasks


@on_stores("memory", "dynamodb", "redis")
async def test_background_task_does_not_delay_the_response(start: Start) -> None:
    async with start("fastapi") as served, served.client() as client:
        began = time.monotonic()
        first = await client.post("/background?delay=2", headers=_headers("slow-task"))
        took = time.monotonic() - began
        # Completed before the task ran: a retry during the task replays, never a 409.
        retry = await client.post("/background?delay=2", headers=_headers("slow-task"))

    assert first.status_code == 200 and first.json() == {"run": 1}
    # Held back by the task, the response would take 2 s or more; below that is the
    # request's own round trip, which a slow machine stretches.
    assert took < 1.9, f"the 2 s background task delayed the response by {took:.1f} s"
    assert retry.status_code == 200 and _replayed(retry)
    assert served.calls["slow-task"] == 1


async def test_failing_background_task_does_not_release_the_key(start: Start) -> None:
    async with start("fastapi") as served, served.client() as client:
        first = await client.post("/background?fail=true", headers=_headers("failing-task"))
        for _ in range(100):
            if served.finished:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # the task's failure reaches the middleware
        retry = await client.post("/background?fail=true", headers=_headers("failing-task"))

    assert first.status_code == 200
    assert retry.status_code == 200 and _replayed(retry) and retry.json() == {"run": 1}
    assert served.calls["failing-task"] == 1


@on_stores("memory", "dynamodb", "redis")
async def test_background_task_outliving_the_deadline_leaves_a_completed_key(
    start: Start,
) -> None:
    async with start("fastapi") as served, served.client() as client:
        first = await client.post("/background?delay=1.5", headers=_headers("long-task"))
        await asyncio.sleep(TIMEOUT + 1.0)  # past the deadline and the lease
        retry = await client.post("/background?delay=1.5", headers=_headers("long-task"))

    assert first.status_code == 200
    assert served.finished == ["long-task"]  # the task was not cut off either
    assert retry.status_code == 200 and _replayed(retry)
    assert served.calls["long-task"] == 1


# ---------------------------------------------------------------------- slow readers


@on_stores("memory", "dynamodb", "redis")
@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_slow_reader_gets_the_whole_stream_and_the_key_completes(
    start: Start, framework: str
) -> None:
    count = SLOW_BYTES // CHUNK
    async with start(framework) as served, served.client() as client:
        received = 0
        began = time.monotonic()
        async with client.stream(
            "POST", f"/stream?count={count}", headers=_headers("slow-reader")
        ) as response:
            async for chunk in response.aiter_raw(CHUNK):
                received += len(chunk)
                await asyncio.sleep(0.02)  # about 3 MB/s: longer than the request deadline
        took = time.monotonic() - began
        retry = await client.post(f"/stream?count={count}", headers=_headers("slow-reader"))

    assert took > TIMEOUT, "the client read faster than the deadline: the test proves nothing"
    assert received == SLOW_BYTES, "the stream was cut short by the request deadline"
    assert served.calls["slow-reader"] == 1
    # Over the store's limit: the retry is told so, and the endpoint did not run again.
    assert _replayed(retry) and retry.headers["idempotency-response-stored"] == "false"
    assert "too large" in retry.json()["detail"]


# ---------------------------------------------------------------------- vanished clients


@on_stores("memory", "dynamodb", "redis")
@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_client_gone_mid_stream_never_runs_the_endpoint_again(
    start: Start, framework: str
) -> None:
    path = "/stream?count=20&pause=0.05&size=1000"
    async with start(framework) as served:
        async with (
            served.client() as client,
            client.stream("POST", path, headers=_headers("gone")) as response,
        ):
            async for _ in response.aiter_raw():
                break  # the client goes away after the first chunk
        await asyncio.sleep(2.0)  # the endpoint ends (or is stopped by the server)
        async with served.client() as client:
            retry = await client.post(path, headers=_headers("gone"))

    assert served.calls["gone"] == 1
    assert _replayed(retry)
    if retry.headers.get("idempotency-response-stored") == "false":
        detail = retry.json()["detail"]
        assert "disconnected" in detail and "too large" not in detail, detail
    else:  # the endpoint went on producing the stream: it was captured whole
        assert len(retry.content) == 20 * 1000


# ---------------------------------------------------------------------- deadline


@on_stores("memory", "dynamodb", "redis")
@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_endpoint_cut_off_before_answering_is_504_and_runs_again_later(
    start: Start, framework: str
) -> None:
    async with start(framework) as served, served.client() as client:
        began = time.monotonic()
        cut = await client.post("/slow?delay=3", headers=_headers("cut"))
        took = time.monotonic() - began
        await asyncio.sleep(1.0)  # the lease (the deadline + a reserve) ends
        retry = await client.post("/slow?delay=0", headers=_headers("cut"))

    assert cut.status_code == 504 and cut.headers["content-type"] == "application/problem+json"
    assert took < 2.5
    assert retry.status_code == 200 and retry.json() == {"run": 2}
