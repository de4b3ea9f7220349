"""Transactional FastAPI routes return what plain routes return, serialized as FastAPI
serializes a plain route's return value — checked byte for byte against plain twins —
and a transactional route that returns without running its transaction is a 500.

Served by uvicorn on loopback, with the real Postgres fixture; clients are concurrent.
The version matrix (``.ci/versions``) runs this file on the oldest and newest supported
FastAPI.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from _http_apps import serve_asgi
from _postgres import PostgresServer, fresh_table_name
from fastapi import APIRouter, BackgroundTasks, FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from idempotency_async import Manager, Options, Wait
from idempotency_async.events import Event
from idempotency_async.integrations.fastapi import IdempotentTransaction
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.postgres import PostgresStore, create_table

# One app, server and pool for the module (each test uses keys of its own).
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio(loop_scope="module")]


class Item(BaseModel):
    id: str
    sku: str = Field(alias="skuCode")
    qty: int = 1
    note: str | None = None
    price: decimal.Decimal = decimal.Decimal("9.50")
    made: datetime.date = datetime.date(2026, 1, 2)

    model_config = {"populate_by_name": True}


class Pretty(JSONResponse):
    """A response class of the application's own (set by an including router)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, indent=2, sort_keys=True).encode()


# name -> (route options, the value the endpoint (or its work) returns, sub-response edits)
CASES: dict[str, tuple[dict[str, Any], Callable[[], Any], dict[str, Any]]] = {
    "dict-201": ({"status_code": 201}, lambda: {"id": "o1", "when": datetime.date(2026, 5, 1)}, {}),
    "model": ({"response_model": Item}, lambda: Item(id="o2", skuCode="A1"), {}),
    "dict-through-model": (
        {"response_model": Item, "status_code": 201},
        lambda: {"id": "o3", "skuCode": "B2", "secret": "never sent", "qty": 3},
        {},
    ),
    "model-settings": (
        {
            "response_model": Item,
            "response_model_exclude_unset": True,
            "response_model_by_alias": False,
            "response_model_exclude": {"made"},
        },
        lambda: Item(id="o4", skuCode="C3", note=None),
        {},
    ),
    "model-exclude-none-include": (
        {
            "response_model": Item,
            "response_model_exclude_none": True,
            "response_model_include": {"id", "note", "qty"},
        },
        lambda: Item(id="o5", skuCode="D4"),
        {},
    ),
    "list-of-models": ({"response_model": list[Item]}, lambda: [Item(id="o6", skuCode="E5")], {}),
    "plain-text": ({"response_class": PlainTextResponse}, lambda: "created o7", {}),
    "sub-response": (
        {"status_code": 201},
        lambda: {"id": "o8"},
        {"status": 202, "headers": {"x-trace": "t-1", "location": "/orders/o8"}},
    ),
    "no-content": ({"status_code": 204}, lambda: None, {}),
    "float-and-none": ({}, lambda: {"ratio": 0.1, "none": None, "nested": [1, {"a": True}]}, {}),
}


def _edit(response: Response, edits: dict[str, Any]) -> None:
    if "status" in edits:
        response.status_code = edits["status"]
    for name, value in edits.get("headers", {}).items():
        response.headers[name] = value


class App:
    def __init__(self, pool: Any, records: str, events: list[Event]) -> None:
        self.pool = pool
        self.calls: Counter[str] = Counter()
        manager = Manager(PostgresStore(pool, table=records), Options(on_event=events.append))
        self.app = FastAPI()
        self.app.add_middleware(
            IdempotencyMiddleware,
            manager=manager,
            paths=(),
            request_timeout=10.0,
            wait=Wait(),
            replay_headers=("x-trace",),
        )
        for name, (options, value, edits) in CASES.items():
            self._twins(self.app, name, options, value, edits)
        router = APIRouter()
        name, (options, value, edits) = "included", CASES["dict-201"]
        self._twins(router, name, options, value, edits)
        self.app.include_router(router, prefix="/r", default_response_class=Pretty)
        self._extra_routes()

    def _twins(
        self,
        router: Any,
        name: str,
        options: dict[str, Any],
        value: Callable[[], Any],
        edits: dict[str, Any],
    ) -> None:
        # Twins share their route settings: no response model unless the case names one.
        plain_options = {"response_model": None, **options}

        @router.post(f"/plain/{name}", **plain_options)
        async def plain(response: Response) -> Any:
            _edit(response, edits)
            return value()

        @router.post(f"/tx/{name}", **options)
        async def transactional(response: Response, tx: IdempotentTransaction) -> Response:
            _edit(response, edits)
            async with self.pool.acquire() as connection, connection.transaction():

                async def work() -> Any:
                    self.calls[name] += 1
                    await connection.execute("SELECT 1")
                    await asyncio.sleep(0.05)  # concurrent duplicates meet it in progress
                    return value()

                return await tx.run(connection, work)

    def _extra_routes(self) -> None:
        app, calls = self.app, self.calls

        @app.post("/plain/annotated", status_code=201)
        async def plain_annotated() -> Item:
            return Item(id="a1", skuCode="Z9")

        @app.post("/tx/annotated", status_code=201, response_model=Item)
        async def tx_annotated(tx: IdempotentTransaction) -> Response:
            async with self.pool.acquire() as connection, connection.transaction():
                return await tx.run(connection, lambda: _item("a1", "Z9"))

        @app.post("/tx/background", status_code=201)
        async def background(tasks: BackgroundTasks, tx: IdempotentTransaction) -> Response:
            tasks.add_task(calls.update, ["background"])
            async with self.pool.acquire() as connection, connection.transaction():
                return await tx.run(connection, lambda: _value({"id": "b1"}))

        @app.post("/tx/forgot", status_code=201)
        async def forgot(tx: IdempotentTransaction) -> dict[str, str]:
            calls["forgot"] += 1
            return {"id": "never recorded"}  # the transaction never ran: a defect

        @app.post("/tx/forgot-response", status_code=201)
        async def forgot_response(tx: IdempotentTransaction) -> Response:
            calls["forgot-response"] += 1
            return JSONResponse({"id": "never recorded"}, status_code=201)

        @app.post("/tx/validated")
        async def validated(item: Item, tx: IdempotentTransaction) -> Response:
            raise AssertionError("request validation fails before the endpoint")


async def _item(id: str, sku: str) -> Item:
    return Item(id=id, skuCode=sku)


async def _value(value: Any) -> Any:
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(
    postgres_server: PostgresServer,
) -> AsyncIterator[tuple[App, httpx.AsyncClient, list[Event]]]:
    pool = await postgres_server.pool(max_size=30)
    records = fresh_table_name()
    events: list[Event] = []
    try:
        await create_table(pool, table=records)
        app = App(pool, records, events)
        async with (
            serve_asgi(app.app) as base_url,
            httpx.AsyncClient(
                base_url=base_url, timeout=20, limits=httpx.Limits(max_connections=40)
            ) as client,
        ):
            yield app, client, events
    finally:
        await pool.close()


_VARYING = {"date", "server", "idempotent-replayed"}


def _shape(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """What a client reads: status, headers (but the date, the server and the replay
    flag) and body."""
    # A replay may list the headers in another order; their order carries no meaning.
    headers = sorted((k, v) for k, v in response.headers.multi_items() if k not in _VARYING)
    return response.status_code, headers, response.content


@pytest.mark.parametrize("name", [*CASES, "included", "annotated"])
async def test_a_transactional_route_sends_and_replays_what_its_plain_twin_sends(
    served: tuple[App, httpx.AsyncClient, list[Event]], name: str
) -> None:
    app, client, _ = served
    prefix = "/r" if name == "included" else ""
    plain = await client.post(f"{prefix}/plain/{name}")
    key = {"Idempotency-Key": f"twin-{name}"}
    # Concurrent duplicates: one runs the work, the others wait for its COMMIT and replay.
    answers = await asyncio.gather(
        *(client.post(f"{prefix}/tx/{name}", headers=key) for _ in range(6))
    )
    assert plain.status_code < 500, plain.text
    for answer in answers:
        assert _shape(answer) == _shape(plain), name
    replayed = [a.headers.get("idempotent-replayed") == "true" for a in answers]
    assert replayed.count(False) == 1, replayed
    assert app.calls[name] == (0 if name == "annotated" else 1)


async def test_background_tasks_of_a_transactional_route_run_once_after_the_response(
    served: tuple[App, httpx.AsyncClient, list[Event]],
) -> None:
    app, client, _ = served
    first = await client.post("/tx/background", headers={"Idempotency-Key": "bg-1"})
    again = await client.post("/tx/background", headers={"Idempotency-Key": "bg-1"})
    assert (first.status_code, first.json()) == (201, {"id": "b1"})
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert app.calls["background"] == 1


@pytest.mark.parametrize("route", ["forgot", "forgot-response"])
async def test_a_route_that_returns_without_running_its_transaction_is_a_500(
    served: tuple[App, httpx.AsyncClient, list[Event]],
    route: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, client, events = served
    with caplog.at_level(logging.ERROR, logger="idempotency_async.http"):
        answers = await asyncio.gather(
            *(
                client.post(f"/tx/{route}", headers={"Idempotency-Key": f"{route}-1"})
                for _ in range(3)
            )
        )
    for answer in answers:
        assert answer.status_code == 500
        assert answer.headers["content-type"] == "application/problem+json"
        assert "never recorded" not in answer.text
    assert app.calls[route] == 3  # nothing was recorded: every request ran it
    not_run = [e for e in events if e.kind == "transaction_not_run"]
    assert len({e.key for e in not_run}) == 1 and len(not_run) == 3
    events.clear()
    assert f"/tx/{route}" in caplog.text and "without running its transaction" in caplog.text


async def test_request_validation_on_a_transactional_route_is_frameworks_422(
    served: tuple[App, httpx.AsyncClient, list[Event]],
) -> None:
    _, client, events = served
    events.clear()
    answer = await client.post("/tx/validated", headers={"Idempotency-Key": "v-1"}, json={})
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/json"
    assert not [e for e in events if e.kind == "transaction_not_run"]
