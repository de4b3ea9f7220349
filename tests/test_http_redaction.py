"""HTTP redaction: declared header and body fields never reach the store or a duplicate;
the client whose request ran gets the whole response; never-stored routes.

Through real servers: FastAPI under uvicorn, aiohttp's test server, an httpx client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from _postgres import PostgresServer, fresh_table_name
from aiohttp import web
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from idempotency_async import Manager, MemoryStore, Options, Redaction, Wait, errors
from idempotency_async.integrations._http import HttpIdempotency, HttpSettings
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.fastapi import IdempotencyKey, IdempotentTransaction
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.base import Store
from idempotency_async.stores.postgres import PostgresStore, create_table

SECRET = "wJalrXUtnFEMI-secret"
TOKEN = "tok-1"
FIELDS = ("body.credentials.secret", 'headers."x-token"')
Serve = Callable[[dict[str, Any]], AbstractAsyncContextManager[str]]


def _answer(count: int, kind: str) -> tuple[bytes, str, dict[str, str]]:
    headers = {"x-token": TOKEN, "etag": f'"{count}"', "x-other": "kept"}
    if kind == "text":
        return f"secret {SECRET}".encode(), "text/plain", headers
    body = {"credentials": {"id": "AKIA1", "secret": SECRET}, "run": count}
    return json.dumps(body, indent=1).encode(), "application/json", headers


def _fastapi(middleware: dict[str, Any]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, **middleware)
    count = [0]

    @app.post("/credentials/{kind}", status_code=201)
    async def create(kind: str, request: Request, key: IdempotencyKey) -> Response:
        count[0] += 1
        await asyncio.sleep(float(request.query_params.get("delay", "0")))
        body, media_type, headers = _answer(count[0], kind)
        return Response(body, status_code=201, media_type=media_type, headers=headers)

    return app


def _aiohttp(middleware: dict[str, Any]) -> web.Application:
    app = web.Application(middlewares=[idempotency_middleware(**middleware)])
    count = [0]

    async def create(request: web.Request) -> web.Response:
        count[0] += 1
        await asyncio.sleep(float(request.query.get("delay", "0")))
        body, media_type, headers = _answer(count[0], request.match_info["kind"])
        return web.Response(body=body, status=201, content_type=media_type, headers=headers)

    app.router.add_post("/credentials/{kind}", create)
    return app


@asynccontextmanager
async def _serve_fastapi(middleware: dict[str, Any]) -> AsyncIterator[str]:
    async with serve_asgi(_fastapi(middleware)) as url:
        yield url


@asynccontextmanager
async def _serve_aiohttp(middleware: dict[str, Any]) -> AsyncIterator[str]:
    middleware = {**middleware, "methods": ("POST",)}
    async with serve_aio(_aiohttp(middleware)) as url:
        yield url


@pytest.fixture(params=["fastapi", "aiohttp"])
def serve(request: pytest.FixtureRequest) -> Serve:
    return _serve_fastapi if request.param == "fastapi" else _serve_aiohttp  # type: ignore[return-value]


def _middleware(store: Store, redaction: Any, **options: Any) -> dict[str, Any]:
    return {
        "manager": Manager(store),
        "caller_scope": lambda _: "t1",
        "replay_headers": ("x-token", "x-other"),
        "redaction": redaction,
        **options,
    }


KEY = {"Idempotency-Key": "k1"}


async def _stored(store: Store, path: str) -> Any:
    rules = HttpIdempotency(Manager(store), HttpSettings(caller_scope=lambda _: "t1"))
    key = rules.key_for("POST", path, "k1", "t1")
    verdict = await store.get(key, now=rules.manager.options.clock())
    assert verdict.record is not None
    return verdict.record


async def test_the_first_client_gets_all_and_a_duplicate_the_marked_redacted_response(
    serve: Serve,
) -> None:
    store = MemoryStore()
    options = _middleware(store, Redaction(fields=FIELDS))
    async with serve(options) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert first.status_code == again.status_code == 201
    assert first.json()["credentials"]["secret"] == SECRET
    assert first.headers["x-token"] == TOKEN
    assert "idempotency-response-redacted" not in first.headers
    assert again.json() == {"credentials": {"id": "AKIA1"}, "run": 1}
    assert "x-token" not in again.headers
    assert "etag" not in again.headers  # it described the body as sent
    assert again.headers["x-other"] == "kept"
    assert again.headers["idempotency-response-redacted"] == "true"
    assert again.headers["idempotent-replayed"] == "true"
    record = await _stored(store, "/credentials/{kind}")
    assert SECRET not in repr(record) and TOKEN not in repr(record)


async def test_another_server_over_the_store_replays_the_redacted_response(serve: Serve) -> None:
    store = MemoryStore()
    async with (
        serve(_middleware(store, Redaction(fields=FIELDS))) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/credentials/json", headers=KEY)
    # A second server without redaction of its own replays what the store holds.
    async with serve(_middleware(store, None)) as url, httpx.AsyncClient(base_url=url) as client:
        again = await client.post("/credentials/json", headers=KEY)
    assert first.json()["credentials"]["secret"] == SECRET
    assert again.json() == {"credentials": {"id": "AKIA1"}, "run": 1}
    assert again.headers["idempotency-response-redacted"] == "true"


async def test_a_waiting_duplicate_in_the_same_process_gets_the_redacted_response(
    serve: Serve,
) -> None:
    options = _middleware(MemoryStore(), Redaction(fields=FIELDS), wait=Wait(timeout=5.0))
    async with serve(options) as url, httpx.AsyncClient(base_url=url) as client:
        first = asyncio.create_task(client.post("/credentials/json?delay=0.3", headers=KEY))
        await asyncio.sleep(0.1)
        again = await client.post("/credentials/json?delay=0.3", headers=KEY)
        whole = await first
    assert whole.json()["credentials"]["secret"] == SECRET
    assert again.status_code == 201
    assert again.json() == {"credentials": {"id": "AKIA1"}, "run": 1}
    assert "x-token" not in again.headers


async def test_a_body_the_fields_cannot_be_looked_for_in_is_not_stored(serve: Serve) -> None:
    store = MemoryStore()
    async with (
        serve(_middleware(store, Redaction(fields=FIELDS))) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/credentials/text", headers=KEY)
        again = await client.post("/credentials/text", headers=KEY)
    assert first.text == f"secret {SECRET}"
    assert first.headers["idempotency-response-stored"] == "false"
    assert again.status_code == 201  # the original status, with the not-stored problem
    assert again.headers["idempotency-response-stored"] == "false"
    assert "not JSON" in again.json()["detail"]
    assert SECRET not in again.text
    assert SECRET not in repr(await _stored(store, "/credentials/{kind}"))


async def test_a_never_stored_route_completes_without_its_response(serve: Serve) -> None:
    store = MemoryStore()
    options = _middleware(store, Redaction(never_store=True))
    async with serve(options) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert first.json()["credentials"]["secret"] == SECRET
    assert first.headers["idempotency-response-stored"] == "false"
    assert again.status_code == 201
    assert again.headers["idempotency-response-stored"] == "false"
    assert "never_store" in again.json()["detail"]
    record = await _stored(store, "/credentials/{kind}")
    assert not record.response_stored and SECRET not in repr(record)


async def test_a_response_without_the_fields_is_stored_whole_and_unmarked(serve: Serve) -> None:
    redaction = Redaction(fields=("body.absent.member", 'headers."x-absent"'))
    async with (
        serve(_middleware(MemoryStore(), redaction)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert again.content == first.content  # the bytes as sent, not re-encoded
    assert again.headers["etag"] == first.headers["etag"]
    assert "idempotency-response-redacted" not in again.headers


@pytest.mark.parametrize("field", ["status", "credentials.secret", "body", "headers.a.b"])
def test_a_field_outside_headers_and_body_is_refused_at_construction(field: str) -> None:
    with pytest.raises(errors.ConfigError, match="HTTP response"):
        HttpSettings(redaction=Redaction(fields=[field]))


def test_a_manager_that_redacts_is_refused_by_the_middleware() -> None:
    manager = Manager(MemoryStore(), Options(redaction=Redaction(fields="secret")))
    with pytest.raises(errors.ConfigError, match="redaction"):
        idempotency_middleware(manager)


async def test_redaction_per_route_applies_to_the_routes_it_names(serve: Serve) -> None:
    store = MemoryStore()
    per_route = {"/credentials/{kind}": Redaction(fields=FIELDS)}
    async with (
        serve(_middleware(store, per_route)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert again.json() == {"credentials": {"id": "AKIA1"}, "run": 1}
    assert again.headers["idempotency-response-redacted"] == "true"


async def test_a_route_the_mapping_does_not_name_is_stored_whole(serve: Serve) -> None:
    others = {"/other": Redaction(never_store=True)}
    async with (
        serve(_middleware(MemoryStore(), others)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert again.content == first.content
    assert again.headers["x-token"] == TOKEN
    assert "idempotency-response-redacted" not in again.headers


async def test_a_route_declared_never_stored_in_the_mapping(serve: Serve) -> None:
    never = {"/credentials/{kind}": Redaction(never_store=True)}
    async with (
        serve(_middleware(MemoryStore(), never)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert first.json()["credentials"]["secret"] == SECRET
    assert again.headers["idempotency-response-stored"] == "false"
    assert SECRET not in again.text


@pytest.mark.parametrize(
    "redaction",
    [
        ("body.a",),
        {"/r": ("body.a",)},
        {3: Redaction(fields="body.a")},
        {"/r": Redaction(fields="a")},
    ],
)
def test_a_mapping_of_anything_but_route_templates_to_redactions_is_refused(
    redaction: Any,
) -> None:
    with pytest.raises(errors.ConfigError, match=r"redaction|redacted field"):
        HttpSettings(redaction=redaction)


async def test_a_transactional_route_records_the_redacted_response(
    postgres_server: PostgresServer,
) -> None:
    pool = await postgres_server.pool()
    try:
        table = fresh_table_name()
        await create_table(pool, table=table)
        store = PostgresStore(pool, table=table)
        app = FastAPI()
        per_route = {"/grants": Redaction(fields=FIELDS)}
        app.add_middleware(IdempotencyMiddleware, **_middleware(store, per_route))
        runs = [0]

        @app.post("/grants", status_code=201)
        async def grant(tx: IdempotentTransaction) -> Response:
            async with pool.acquire() as connection, connection.transaction():

                async def work() -> Response:
                    runs[0] += 1
                    body = {"credentials": {"id": "AKIA1", "secret": SECRET}, "run": runs[0]}
                    return JSONResponse(body, status_code=201, headers={"x-token": TOKEN})

                response: Response = await tx.run(connection, work)
            return response

        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url) as client:
            first = await client.post("/grants", headers=KEY)
            again = await client.post("/grants", headers=KEY)
        assert first.json()["credentials"]["secret"] == SECRET
        assert first.headers["x-token"] == TOKEN
        assert again.status_code == 201
        assert again.json() == {"credentials": {"id": "AKIA1"}, "run": 1}
        assert "x-token" not in again.headers
        assert again.headers["idempotency-response-redacted"] == "true"
        assert runs == [1]
        assert SECRET not in repr(await _stored(store, "/grants"))
    finally:
        await pool.close()


async def test_a_declared_header_that_is_never_stored_anyway_does_not_mark_the_replay(
    serve: Serve,
) -> None:
    # x-token is sent, declared, and not replayed (not in replay_headers): never stored.
    redaction = Redaction(fields=('headers."set-cookie"', 'headers."x-token"'))
    options = _middleware(MemoryStore(), redaction, replay_headers=())
    async with serve(options) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/credentials/json", headers=KEY)
        again = await client.post("/credentials/json", headers=KEY)
    assert first.headers["x-token"] == TOKEN
    assert again.content == first.content and "x-token" not in again.headers
    assert "idempotency-response-redacted" not in again.headers
