"""Transactional routes over HTTP: the endpoint's order rows and the idempotency record
commit together, through real servers (uvicorn + FastAPI, aiohttp) on loopback and the
real Postgres fixture.

Each app counts how often its endpoint is entered (``endpoint``) and its work runs
(``work``); the work inserts an order row through the endpoint's transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from _postgres import PostgresServer, fresh_table_name
from aiohttp import web
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from idempotency_async import Manager, Wait
from idempotency_async.integrations.aiohttp import (
    idempotency_middleware,
    request_transaction,
    transactional_endpoint,
)
from idempotency_async.integrations.fastapi import IdempotentTransaction
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Claim
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres

REQUEST_TIMEOUT = 5.0
MAX_RESPONSE = 4096


@dataclass
class Env:
    """One test's database: the app's pool, its orders table and its records table."""

    pool: Any
    orders: str
    records: str
    calls: Counter[str] = field(default_factory=Counter)
    working: asyncio.Event = field(default_factory=asyncio.Event)
    snapshot: asyncio.Event = field(default_factory=asyncio.Event)
    proceed: asyncio.Event = field(default_factory=asyncio.Event)

    async def begin(self, connection: Any, isolation: str | None) -> Any:
        """The endpoint's transaction; under ``isolation`` (the request's X-Isolation) its
        snapshot is taken at once, then it waits for the test's ``proceed``."""
        transaction = connection.transaction(isolation=isolation or "read_committed")
        await transaction.start()
        if isolation:
            await connection.fetchval("SELECT 1")
            self.snapshot.set()
            await asyncio.wait_for(self.proceed.wait(), timeout=10)
        return transaction

    async def work(
        self, connection: Any, key: str, order_id: str, sku: str, delay: float, mode: str
    ) -> tuple[int, dict[str, Any]]:
        """The side effect: an order row written through the endpoint's transaction.  With
        ``mode`` "raise" or "503" the first attempt of a key fails after writing it; with
        "hold" the work waits until another request took its snapshot."""
        self.calls["work"] += 1
        run = self.calls["work"]
        await connection.execute(
            f"INSERT INTO {self.orders} (key, order_id, sku, run) VALUES ($1, $2, $3, $4)",
            key,
            order_id,
            sku,
            run,
        )
        self.working.set()
        await asyncio.sleep(delay)
        if mode == "hold":
            await asyncio.wait_for(self.snapshot.wait(), timeout=10)
        first = self._first(f"work-{mode}:{key}")
        if mode == "raise" and first:
            raise RuntimeError("the work failed after writing its order")
        if mode == "503" and first:
            return 503, {"error": "unavailable"}
        if mode == "big":
            return 201, {"order_id": order_id, "blob": "x" * MAX_RESPONSE}
        return 201, {"order_id": order_id, "sku": sku, "run": run}

    async def after(self, connection: Any, key: str, mode: str) -> None:
        """After the transactional call returned: with ``mode`` "after", the first
        attempt's next statement fails, so its transaction rolls back."""
        if mode == "after" and self._first(f"after-run:{key}"):
            await connection.execute("SELECT 1 / 0")

    def _first(self, attempt: str) -> bool:
        self.calls[attempt] += 1
        return self.calls[attempt] == 1

    async def count(self, table: str) -> int:
        found: int = await self.pool.fetchval(f"SELECT count(*) FROM {table}")
        return found


@pytest.fixture
async def env(postgres_server: PostgresServer) -> AsyncIterator[Env]:
    pool = await postgres_server.pool(max_size=20)
    try:
        records, orders = fresh_table_name(), fresh_table_name()
        await create_table(pool, table=records)
        await pool.execute(f"CREATE TABLE {orders} (key text, order_id text, sku text, run int)")
        yield Env(pool, orders, records)
    finally:
        await pool.close()


def _settings(wait: bool) -> dict[str, Any]:
    return {
        "paths": (),
        "caller_scope": lambda request: request.headers.get("x-tenant"),
        "request_timeout": REQUEST_TIMEOUT,
        "wait": Wait(timeout=REQUEST_TIMEOUT) if wait else False,
        "max_response_bytes": MAX_RESPONSE,
    }


class _Order(BaseModel):
    sku: str
    delay: float = 0.0
    mode: str = ""


def fastapi_app(env: Env, wait: bool, *, middleware: bool = True) -> FastAPI:
    app = FastAPI()
    manager = Manager(PostgresStore(env.pool, table=env.records))
    if middleware:
        app.add_middleware(IdempotencyMiddleware, manager=manager, **_settings(wait))

    @app.post("/orders/{order_id}", status_code=201)
    async def create_order(
        order_id: str, order: _Order, request: Request, tx: IdempotentTransaction
    ) -> Response:
        env.calls["endpoint"] += 1
        if order.mode == "skip":  # a defect: the route never runs its transaction
            return JSONResponse({"order_id": order_id}, status_code=201)
        async with env.pool.acquire() as connection:
            transaction = await env.begin(connection, request.headers.get("x-isolation"))

            async def work() -> Response:
                status, body = await env.work(
                    connection, tx.key, order_id, order.sku, order.delay, order.mode
                )
                if order.mode == "stream":
                    return StreamingResponse(iter([b"not recordable"]))
                response = JSONResponse(
                    body, status_code=status, headers={"location": f"/orders/{order_id}"}
                )
                response.set_cookie("session", f"run-{env.calls['work']}")
                return response

            try:
                response = await tx.run(connection, work)
                await env.after(connection, tx.key, order.mode)
            except BaseException:
                await transaction.rollback()
                raise
            await transaction.commit()
        return response

    return app


def aiohttp_app(env: Env, wait: bool, *, middleware: bool = True) -> web.Application:
    manager = Manager(PostgresStore(env.pool, table=env.records))
    middlewares = [idempotency_middleware(manager, **_settings(wait))] if middleware else []
    app = web.Application(middlewares=middlewares)

    @transactional_endpoint
    async def create_order(request: web.Request) -> web.Response:
        env.calls["endpoint"] += 1
        tx = request_transaction(request)
        order = _Order.model_validate(await request.json())
        order_id = request.match_info["order_id"]
        if order.mode == "skip":  # a defect: the handler never runs its transaction
            return web.json_response({"order_id": order_id}, status=201)
        async with env.pool.acquire() as connection:
            transaction = await env.begin(connection, request.headers.get("x-isolation"))

            async def work() -> web.Response:
                status, body = await env.work(
                    connection, tx.key, order_id, order.sku, order.delay, order.mode
                )
                if order.mode == "stream":
                    return web.StreamResponse()  # type: ignore[return-value]
                response = web.json_response(
                    body, status=status, headers={"Location": f"/orders/{order_id}"}
                )
                response.set_cookie("session", f"run-{env.calls['work']}")
                return response

            try:
                response = await tx.run(connection, work)
                await env.after(connection, tx.key, order.mode)
            except BaseException:
                await transaction.rollback()
                raise
            await transaction.commit()
        return response

    app.router.add_post("/orders/{order_id}", create_order)
    return app


def _fastapi(env: Env, wait: bool) -> AbstractAsyncContextManager[str]:
    return serve_asgi(fastapi_app(env, wait))


def _aiohttp(env: Env, wait: bool) -> AbstractAsyncContextManager[str]:
    return serve_aio(aiohttp_app(env, wait))


SERVERS: dict[str, Callable[[Env, bool], AbstractAsyncContextManager[str]]] = {
    "fastapi": _fastapi,
    "aiohttp": _aiohttp,
}
Start = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture(params=sorted(SERVERS))
async def start(request: pytest.FixtureRequest, env: Env) -> AsyncIterator[Start]:
    """Serves the parametrized framework's app (``wait``: duplicates wait on the row)."""
    serve = SERVERS[request.param]
    servers: list[AbstractAsyncContextManager[str]] = []
    clients: list[httpx.AsyncClient] = []

    async def _start(wait: bool = False) -> httpx.AsyncClient:
        server = serve(env, wait)
        base_url = await server.__aenter__()
        servers.append(server)
        client = httpx.AsyncClient(
            base_url=base_url, timeout=20, limits=httpx.Limits(max_connections=50)
        )
        clients.append(client)
        return client

    try:
        yield _start
    finally:
        for client in clients:
            await client.aclose()
        for server in reversed(servers):
            await server.__aexit__(None, None, None)


def _key(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-Tenant": "t1"}


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


def _is_problem(response: httpx.Response) -> bool:
    return response.headers["content-type"] == "application/problem+json"


async def test_concurrent_duplicates_commit_one_order_and_all_get_its_response(
    start: Start, env: Env
) -> None:
    client = await start(wait=True)
    order = {"sku": "A", "delay": 0.3}

    responses = await asyncio.gather(
        *(client.post("/orders/o-1", json=order, headers=_key("c")) for _ in range(8))
    )

    assert [response.status_code for response in responses] == [201] * 8
    originals = [response for response in responses if not _replayed(response)]
    assert len(originals) == 1
    assert {response.content for response in responses} == {originals[0].content}
    assert {response.headers["location"] for response in responses} == {"/orders/o-1"}
    assert env.calls["work"] == 1
    assert await env.count(env.orders) == 1
    statuses = await env.pool.fetch(f"SELECT status FROM {env.records}")
    assert [row["status"] for row in statuses] == ["COMPLETED"]


async def test_a_duplicate_while_the_transaction_is_open_is_409_then_replays(
    start: Start, env: Env
) -> None:
    client = await start(wait=False)
    order = {"sku": "A", "delay": 1.0}
    first = asyncio.create_task(client.post("/orders/o-1", json=order, headers=_key("p")))
    # The work runs once the row is claimed (and locked) in the first transaction.
    await asyncio.wait_for(env.working.wait(), timeout=10)

    duplicate = await client.post("/orders/o-1", json=order, headers=_key("p"))
    created = await first
    retry = await client.post("/orders/o-1", json=order, headers=_key("p"))

    assert duplicate.status_code == 409 and _is_problem(duplicate)
    assert 1 <= int(duplicate.headers["retry-after"]) <= REQUEST_TIMEOUT
    assert created.status_code == 201 and not _replayed(created)
    assert retry.status_code == 201 and _replayed(retry)
    assert retry.content == created.content
    assert env.calls["work"] == 1
    assert await env.count(env.orders) == 1


@pytest.mark.parametrize(
    ("mode", "status"),
    [("raise", 500), ("503", 503), ("after", 500)],
    ids=["work-raises", "work-answers-503", "rolled-back-after-run"],
)
async def test_a_failed_attempt_commits_nothing_and_a_retry_runs(
    start: Start, env: Env, mode: str, status: int
) -> None:
    client = await start()
    order = {"sku": "A", "mode": mode}

    failed = await client.post("/orders/o-1", json=order, headers=_key("f"))
    left = (await env.count(env.orders), await env.count(env.records))
    retry = await client.post("/orders/o-1", json=order, headers=_key("f"))
    replay = await client.post("/orders/o-1", json=order, headers=_key("f"))

    assert failed.status_code == status
    assert left == (0, 0)  # neither the order row nor the record committed
    assert retry.status_code == 201 and not _replayed(retry)
    assert replay.status_code == 201 and _replayed(replay)
    assert replay.content == retry.content
    assert env.calls["work"] == 2
    assert await env.count(env.orders) == 1


async def test_a_reused_key_is_422_without_running_the_endpoint(start: Start, env: Env) -> None:
    client = await start()

    created = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("u"))
    reused = await client.post("/orders/o-1", json={"sku": "B"}, headers=_key("u"))

    assert created.status_code == 201
    assert reused.status_code == 422 and _is_problem(reused)
    assert "differs from the one first sent" in reused.json()["detail"]
    assert env.calls["endpoint"] == 1
    assert await env.count(env.orders) == 1


async def test_a_committed_response_replays_without_running_the_endpoint(
    start: Start, env: Env
) -> None:
    client = await start()

    created = await client.post("/orders/o-7", json={"sku": "A"}, headers=_key("r"))
    replay = await client.post("/orders/o-7", json={"sku": "A"}, headers=_key("r"))

    assert created.status_code == replay.status_code == 201
    assert not _replayed(created) and _replayed(replay)
    assert replay.content == created.content
    assert replay.headers["location"] == created.headers["location"] == "/orders/o-7"
    assert replay.headers["content-type"] == created.headers["content-type"]
    assert "set-cookie" in created.headers and "set-cookie" not in replay.headers
    assert env.calls["endpoint"] == 1


async def test_a_transactional_route_requires_the_key(start: Start, env: Env) -> None:
    client = await start()

    response = await client.post("/orders/o-1", json={"sku": "A"}, headers={"X-Tenant": "t1"})

    assert response.status_code == 400 and _is_problem(response)
    assert env.calls["endpoint"] == 0


async def test_a_response_too_large_to_store_is_sent_flagged_and_not_replayed(
    start: Start, env: Env
) -> None:
    client = await start()
    order = {"sku": "A", "mode": "big"}

    created = await client.post("/orders/o-1", json=order, headers=_key("b"))
    duplicate = await client.post("/orders/o-1", json=order, headers=_key("b"))

    assert created.status_code == 201 and len(created.content) > MAX_RESPONSE
    assert created.headers["idempotency-response-stored"] == "false"
    # The original status, and why the response is not available.
    assert duplicate.status_code == 201 and _is_problem(duplicate)
    assert duplicate.headers["idempotency-response-stored"] == "false"
    assert "over the limit of 4096" in duplicate.json()["detail"]
    assert env.calls["work"] == 1 and env.calls["endpoint"] == 1
    assert await env.count(env.orders) == 1


async def test_a_serialization_failure_is_409_and_the_retry_replays(start: Start, env: Env) -> None:
    client = await start(wait=True)
    order = {"sku": "A", "mode": "hold"}  # the first holds its transaction open...
    first = asyncio.create_task(client.post("/orders/o-1", json=order, headers=_key("s")))
    await asyncio.wait_for(env.working.wait(), timeout=10)
    # ...until this one took its REPEATABLE READ snapshot; it then meets the record the
    # first committed, which its snapshot cannot see: it must run again.
    second = asyncio.create_task(
        client.post(
            "/orders/o-1", json=order, headers={**_key("s"), "X-Isolation": "repeatable_read"}
        )
    )
    created = await first
    env.proceed.set()
    conflicted = await second
    retry = await client.post("/orders/o-1", json=order, headers=_key("s"))

    assert created.status_code == 201
    assert conflicted.status_code == 409 and _is_problem(conflicted)
    assert conflicted.json()["title"] == "Request conflicted"
    assert conflicted.headers["retry-after"] == "1"
    assert retry.status_code == 201 and _replayed(retry) and retry.content == created.content
    assert env.calls["work"] == 1
    assert await env.count(env.orders) == 1


async def test_a_key_held_by_a_lease_is_409_without_running_the_endpoint(
    start: Start, env: Env
) -> None:
    client = await start()
    # A lease-mode claim of the same request (e.g. sent to a non-transactional route of an
    # earlier deployment), committed and live.
    store = PostgresStore(env.pool, table=env.records)
    middleware = idempotency_middleware(Manager(store), **_settings(False))
    key = middleware.key_for("POST", "/orders/{order_id}", "l", caller="t1")  # type: ignore[attr-defined]
    await store.claim(Claim(key, "a-lease-holder", time.time(), 30.0, 3600.0))

    response = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("l"))

    assert response.status_code == 409 and _is_problem(response)
    assert 1 <= int(response.headers["retry-after"]) <= 30
    assert env.calls["endpoint"] == 0


async def test_a_transactional_endpoint_without_the_middleware_never_runs(env: Env) -> None:
    async with (
        serve_asgi(fastapi_app(env, False, middleware=False)) as one,
        serve_aio(aiohttp_app(env, False, middleware=False)) as two,
        httpx.AsyncClient() as client,
    ):
        answers = [
            await client.post(f"{url}/orders/o-1", json={"sku": "A"}, headers=_key("n"))
            for url in (one, two)
        ]

    assert [answer.status_code for answer in answers] == [500, 500]
    assert env.calls["endpoint"] == env.calls["work"] == 0


async def test_a_streamed_response_is_refused_and_nothing_commits(start: Start, env: Env) -> None:
    client = await start()

    refused = await client.post(
        "/orders/o-1", json={"sku": "A", "mode": "stream"}, headers=_key("t")
    )

    assert refused.status_code == 500  # a ConfigError: the work's writes rolled back
    assert env.calls["work"] == 1
    assert (await env.count(env.orders), await env.count(env.records)) == (0, 0)


async def test_a_route_that_returns_without_running_its_transaction_is_a_500(
    start: Start, env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start()

    with caplog.at_level("ERROR", logger="idempotency_async.http"):
        answers = [
            await client.post("/orders/o-1", json={"sku": "A", "mode": "skip"}, headers=_key("s"))
            for _ in range(2)
        ]

    # Never a silent success: nothing was recorded, so each request ran the endpoint.
    assert [answer.status_code for answer in answers] == [500, 500]
    assert all(_is_problem(answer) and "o-1" not in answer.text for answer in answers)
    assert env.calls["endpoint"] == 2 and env.calls["work"] == 0
    assert "without running its transaction" in caplog.text
