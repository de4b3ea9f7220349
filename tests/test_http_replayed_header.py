"""The replayed header's name is configurable, and the key lifetime is in the OpenAPI schema.

Through real servers: FastAPI under uvicorn, aiohttp's test server, an httpx client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from fastapi import FastAPI, Request, Response

from idempotency_async import Manager, MemoryStore, Options, errors
from idempotency_async.integrations._http import HttpSettings
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.fastapi import IdempotencyKey, idempotency_openapi
from idempotency_async.integrations.starlette import IdempotencyMiddleware

HEADER = "X-Idempotent-Replay"
Serve = Callable[[dict[str, Any]], AbstractAsyncContextManager[str]]


def _fastapi(middleware: dict[str, Any]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, **middleware)
    count = [0]

    @app.post("/orders", status_code=201)
    async def create(request: Request, key: IdempotencyKey) -> Response:
        count[0] += 1
        size = int(request.query_params.get("size", "1"))
        return Response(f"order {count[0]} " + "x" * size, status_code=201)

    return app


def _aiohttp(middleware: dict[str, Any]) -> web.Application:
    app = web.Application(middlewares=[idempotency_middleware(**middleware)])
    count = [0]

    async def create(request: web.Request) -> web.Response:
        count[0] += 1
        size = int(request.query.get("size", "1"))
        return web.Response(text=f"order {count[0]} " + "x" * size, status=201)

    app.router.add_post("/orders", create)
    return app


@asynccontextmanager
async def _serve_fastapi(middleware: dict[str, Any]) -> AsyncIterator[str]:
    async with serve_asgi(_fastapi(middleware)) as url:
        yield url


@asynccontextmanager
async def _serve_aiohttp(middleware: dict[str, Any]) -> AsyncIterator[str]:
    async with serve_aio(_aiohttp(middleware)) as url:
        yield url


@pytest.fixture(params=["fastapi", "aiohttp"])
def serve(request: pytest.FixtureRequest) -> Serve:
    return _serve_fastapi if request.param == "fastapi" else _serve_aiohttp  # type: ignore[return-value]


def _middleware(**options: Any) -> dict[str, Any]:
    return {"manager": Manager(MemoryStore()), "caller_scope": lambda _: "t1", **options}


async def test_replays_carry_the_configured_header_and_not_the_default(serve: Serve) -> None:
    async with (
        serve(_middleware(replayed_header=HEADER)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/orders", headers={"Idempotency-Key": "k1"})
        again = await client.post("/orders", headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert first.text == again.text == "order 1 x"
    assert HEADER not in first.headers
    assert again.headers[HEADER] == "true"
    assert "idempotent-replayed" not in again.headers


async def test_a_not_stored_answer_carries_the_configured_header(serve: Serve) -> None:
    options = _middleware(replayed_header=HEADER, max_response_bytes=64)
    async with serve(options) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/orders?size=500", headers={"Idempotency-Key": "k1"})
        again = await client.post("/orders?size=500", headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201 and len(first.text) > 500
    assert again.headers["idempotency-response-stored"] == "false"
    assert again.headers[HEADER] == "true"
    assert "idempotent-replayed" not in again.headers


async def test_the_default_header_is_idempotent_replayed(serve: Serve) -> None:
    async with serve(_middleware()) as url, httpx.AsyncClient(base_url=url) as client:
        await client.post("/orders", headers={"Idempotency-Key": "k1"})
        again = await client.post("/orders", headers={"Idempotency-Key": "k1"})
    assert again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("name", "replay_headers"),
    [
        ("content-type", ()),
        ("Set-Cookie", ()),
        ("Idempotency-Key", ()),
        ("bad header", ()),
        ("", ()),
        ("X-Replayed", ("x-replayed",)),
    ],
)
def test_a_replayed_header_the_middleware_cannot_own_is_refused(
    name: str, replay_headers: tuple[str, ...]
) -> None:
    with pytest.raises(errors.ConfigError, match="replayed_header"):
        HttpSettings(replayed_header=name, replay_headers=replay_headers)
    with pytest.raises(errors.ConfigError, match="replayed_header"):
        idempotency_middleware(
            Manager(MemoryStore()), replayed_header=name, replay_headers=replay_headers
        )


async def test_openapi_publishes_the_key_lifetime_and_the_replayed_header() -> None:
    manager = Manager(MemoryStore(), Options(expires_after=120))
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware, manager=manager, replayed_header=HEADER, caller_scope=lambda _: "t"
    )

    @app.post(
        "/orders",
        status_code=201,
        openapi_extra=idempotency_openapi(manager, replayed_header=HEADER),
    )
    async def create(key: IdempotencyKey) -> dict[str, str]:
        return {"id": "o1"}

    @app.post("/plain", status_code=201, openapi_extra=idempotency_openapi())
    async def plain(key: IdempotencyKey) -> dict[str, str]:
        return {"id": "o1"}

    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url) as client:
        schema = (await client.get("/openapi.json")).json()
        await client.post("/orders", headers={"Idempotency-Key": "k1"})
        replay = await client.post("/orders", headers={"Idempotency-Key": "k1"})
    operation = schema["paths"]["/orders"]["post"]
    assert operation["x-idempotency"] == {
        "keyHeader": "Idempotency-Key",
        "replayedHeader": HEADER,
        "keyLifetimeSeconds": 120,
    }
    assert "remembered for 120 seconds" in operation["responses"]["422"]["description"]
    assert "Retry-After" in operation["responses"]["409"]["headers"]
    assert "201" in operation["responses"]  # the route's own answer stays
    # What the schema says is what the middleware sends.
    assert replay.headers[operation["x-idempotency"]["replayedHeader"]] == "true"
    plain_operation = schema["paths"]["/plain"]["post"]
    assert plain_operation["x-idempotency"] == {
        "keyHeader": "Idempotency-Key",
        "replayedHeader": "Idempotent-Replayed",
    }
    assert "remembered" not in plain_operation["responses"]["422"]["description"]


def test_openapi_refuses_a_replayed_header_the_middleware_would_refuse() -> None:
    with pytest.raises(errors.ConfigError, match="replayed_header"):
        idempotency_openapi(replayed_header="content-type")
