"""Recovery points at every door: ``step()`` inside a FastAPI route and an aiohttp handler
served on loopback, a Lambda handler, the records of a Lambda batch, and an MCP tool.

Each door's first run fails after its first step (the endpoint raises, answers 503, the
batch record or the tool raises); the retry resumes: the first step's function does not
run again, its recorded result comes back, and the later steps run once.  In process,
two claims of docs/steps.md: a waiting duplicate resumes when the holder fails, and a
retry that returns before its recorded steps completes the record.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from fastapi import FastAPI
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from idempotency_async import Event, Manager, MemoryStore, Options, Wait, step
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.aws_lambda import idempotent_handler, process_batch
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.mcp import idempotent_tool
from idempotency_async.integrations.starlette import IdempotencyMiddleware

EVENTS = Path(__file__).parent / "events"


class Effects:
    """The side effects of the steps: how often each ran, per order."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.fail_once: set[str] = set()
        """Orders whose next run fails right after their first step."""

    async def reserve(self, order: str) -> dict[str, Any]:
        self.runs[f"reserve:{order}"] += 1
        return {"reservation": f"res-{order}-{self.runs[f'reserve:{order}']}"}

    async def charge(self, order: str, delay: float = 0.0) -> dict[str, Any]:
        await asyncio.sleep(delay)
        self.runs[f"charge:{order}"] += 1
        return {"charge": f"ch-{order}-{self.runs[f'charge:{order}']}"}

    def failing(self, order: str) -> bool:
        if order in self.fail_once:
            self.fail_once.discard(order)
            return True
        return False

    async def place(self, order: str, delay: float = 0.0) -> dict[str, Any]:
        """Two steps, with the failure between them."""
        reserved = await step("reserve", lambda: self.reserve(order))
        if self.failing(order):
            raise ConnectionError(f"the charge service is down for {order}")
        charged = await step("charge", lambda: self.charge(order, delay))
        return {"order": order, **reserved, **charged}


def _kinds(events: list[Event]) -> Counter[str]:
    return Counter(event.kind for event in events)


# ---------------------------------------------------------------------- FastAPI


class Body(BaseModel):
    sku: str
    delay: float = 0.0


def _fastapi_app(effects: Effects, events: list[Event]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(MemoryStore(), Options(on_event=events.append)),
        paths=(),
        required=True,
        caller_scope=lambda request: "the-caller",
    )

    @app.post("/orders/{order_id}", status_code=201)
    async def create_order(order_id: str, body: Body, key: IdempotencyKey) -> dict[str, Any]:
        return await effects.place(order_id, body.delay)

    return app


async def test_fastapi_route_resumes_after_a_500_without_running_its_first_step_again() -> None:
    effects, events = Effects(), []
    effects.fail_once.add("o1")
    async with (
        serve_asgi(_fastapi_app(effects, events)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        headers = {"Idempotency-Key": "k-1"}
        failed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})
        # At once: the 500 released the key with its progress kept (no lease to wait for).
        resumed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})
        replayed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})
        other = await client.post("/orders/o1", headers=headers, json={"sku": "B2"})

    assert failed.status_code == 500
    assert resumed.status_code == 201, resumed.text
    assert resumed.json() == {"order": "o1", "reservation": "res-o1-1", "charge": "ch-o1-1"}
    assert replayed.json() == resumed.json()
    assert replayed.headers["idempotent-replayed"] == "true"
    assert other.status_code == 422  # the key's record is completed, for another body
    assert effects.runs == Counter({"reserve:o1": 1, "charge:o1": 1})
    kinds = _kinds(events)
    assert kinds["released"] == 1 and kinds["step_replayed"] == 1
    assert kinds["step_recorded"] == 2  # reserve on the first run, charge on the retry


async def test_fastapi_route_refuses_another_body_on_a_key_holding_progress() -> None:
    effects, events = Effects(), []
    effects.fail_once.add("o2")
    async with (
        serve_asgi(_fastapi_app(effects, events)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        headers = {"Idempotency-Key": "k-2"}
        failed = await client.post("/orders/o2", headers=headers, json={"sku": "A1"})
        other = await client.post("/orders/o2", headers=headers, json={"sku": "B2"})
        resumed = await client.post("/orders/o2", headers=headers, json={"sku": "A1"})

    assert failed.status_code == 500
    # The progress belongs to the first body: another one is refused, nothing runs.
    assert other.status_code == 422, other.text
    assert resumed.status_code == 201
    assert effects.runs == Counter({"reserve:o2": 1, "charge:o2": 1})


async def test_fastapi_concurrent_clients_run_each_step_once_per_key() -> None:
    effects, events = Effects(), []
    async with (
        serve_asgi(_fastapi_app(effects, events)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):

        async def send(order: str) -> httpx.Response:
            return await client.post(
                f"/orders/{order}",
                headers={"Idempotency-Key": f"key-{order}"},
                json={"sku": "A1", "delay": 1.0},
            )

        orders = ["c1", "c2", "c3"]
        first = await asyncio.gather(*(send(order) for order in orders * 4))
        again = await asyncio.gather(*(send(order) for order in orders))

    ran = [r for r in first if r.status_code == 201 and "idempotent-replayed" not in r.headers]
    others = Counter(r.status_code for r in first if r not in ran)
    # Per key, one client ran the steps; the others were told it is in progress (or, on a
    # slow machine, arrived after it completed and got its replay).
    assert len(ran) == 3 and set(others) <= {409, 201}, others
    assert effects.runs == Counter(
        {f"{kind}:{o}": 1 for kind in ("reserve", "charge") for o in orders}
    )
    for order, response in zip(orders, again, strict=True):
        assert response.status_code == 201
        assert response.headers["idempotent-replayed"] == "true"
        assert response.json()["charge"] == f"ch-{order}-1"
    assert _kinds(events)["step_recorded"] == 6


# ---------------------------------------------------------------------- aiohttp


def _aiohttp_app(effects: Effects, events: list[Event]) -> web.Application:
    manager = Manager(MemoryStore(), Options(on_event=events.append))
    app = web.Application(
        middlewares=[
            idempotency_middleware(manager, paths=(), caller_scope=lambda request: "the-caller")
        ]
    )

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response:
        order = request.match_info["order_id"]
        reserved = await step("reserve", lambda: effects.reserve(order))
        if effects.failing(order):
            return web.json_response({"error": "charge service unavailable"}, status=503)
        charged = await step("charge", lambda: effects.charge(order))
        return web.json_response({"order": order, **reserved, **charged}, status=201)

    app.router.add_post("/orders/{order_id}", create_order)
    return app


async def test_aiohttp_endpoint_resumes_after_a_503_without_running_its_first_step_again() -> None:
    effects, events = Effects(), []
    effects.fail_once.add("o1")
    async with (
        serve_aio(_aiohttp_app(effects, events)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        headers = {"Idempotency-Key": "k-1"}
        failed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})
        resumed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})
        replayed = await client.post("/orders/o1", headers=headers, json={"sku": "A1"})

    assert failed.status_code == 503
    assert resumed.status_code == 201, resumed.text
    assert resumed.json() == {"order": "o1", "reservation": "res-o1-1", "charge": "ch-o1-1"}
    assert replayed.json() == resumed.json()
    assert replayed.headers["idempotent-replayed"] == "true"
    assert effects.runs == Counter({"reserve:o1": 1, "charge:o1": 1})
    assert _kinds(events)["step_replayed"] == 1


# ---------------------------------------------------------------------- AWS Lambda


class _Context:
    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = "orders"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def _event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def _redelivered(event: dict[str, Any]) -> dict[str, Any]:
    again = copy.deepcopy(event)
    if "requestContext" in again:
        again["requestContext"]["requestId"] = str(uuid.uuid4())
    for record in again.get("Records", []):
        record["receiptHandle"] = f"AQEB{uuid.uuid4().hex}=="
        record["attributes"]["ApproximateReceiveCount"] = "2"
    return again


async def test_lambda_handler_resumes_a_failed_invocation_at_its_second_step() -> None:
    effects, events = Effects(), []
    manager = Manager(
        MemoryStore(),
        Options(
            key_prefix="orders",
            event_key_jmespath="powertools_json(body).order_id",
            on_event=events.append,
        ),
    )

    @idempotent_handler(manager)
    async def handler(event: dict[str, Any], context: _Context) -> dict[str, Any]:
        order = json.loads(event["body"])["order_id"]
        return {"statusCode": 201, "body": json.dumps(await effects.place(order))}

    event = _event("api_gateway_http_v2.json")
    order = json.loads(event["body"])["order_id"]
    effects.fail_once.add(order)
    try:
        await handler(event, _Context())
    except ConnectionError:
        pass
    else:  # pragma: no cover - the failure is the point
        raise AssertionError("the first invocation should have failed")
    resumed = await handler(_redelivered(event), _Context())
    replayed = await handler(_redelivered(event), _Context())

    assert resumed == replayed and resumed["statusCode"] == 201
    assert json.loads(resumed["body"])["reservation"] == f"res-{order}-1"
    assert effects.runs == Counter({f"reserve:{order}": 1, f"charge:{order}": 1})
    assert _kinds(events)["step_replayed"] == 1


async def test_batch_records_take_their_own_steps_and_a_failed_one_resumes_on_redelivery() -> None:
    effects, events = Effects(), []
    manager = Manager(
        MemoryStore(),
        Options(key_prefix="ship", event_key_jmespath="body.order_id", on_event=events.append),
    )

    async def ship(record: dict[str, Any]) -> dict[str, Any]:
        return await effects.place(record["body"]["order_id"])

    event = _event("sqs.json")
    orders = [json.loads(record["body"])["order_id"] for record in event["Records"]]
    failing = event["Records"][1]["messageId"]
    effects.fail_once.add(orders[1])

    first = await process_batch(manager, event, ship)
    assert [item["itemIdentifier"] for item in first["batchItemFailures"]] == [failing]
    assert effects.runs == Counter(
        {
            **{f"reserve:{order}": 1 for order in orders},
            **{f"charge:{order}": 1 for order in (orders[0], orders[2])},
        }
    )

    again = await process_batch(manager, _redelivered(event), ship)
    assert again["batchItemFailures"] == []
    # The failed record resumed at its charge; the others replayed without a step.
    assert effects.runs == Counter(
        {f"{kind}:{order}": 1 for kind in ("reserve", "charge") for order in orders}
    )
    kinds = _kinds(events)
    assert kinds["step_replayed"] == 1 and kinds["step_recorded"] == 6


# ---------------------------------------------------------------------- MCP


async def test_mcp_tool_resumes_after_a_tool_error_without_running_its_first_step_again() -> None:
    effects, events = Effects(), []
    effects.fail_once.add("o1")
    server = MCPServer("orders")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options(on_event=events.append)), key="order_id")
    async def place_order(order_id: str) -> dict[str, Any]:
        reserved = await step("reserve", lambda: effects.reserve(order_id))
        if effects.failing(order_id):
            raise ToolError("the charge service is down, try again")
        charged = await step("charge", lambda: effects.charge(order_id))
        return {"order": order_id, **reserved, **charged}

    async with Client(server) as client:
        failed = await client.call_tool("place_order", {"order_id": "o1"})
        resumed = await client.call_tool("place_order", {"order_id": "o1"})
        replayed = await client.call_tool("place_order", {"order_id": "o1"})

    assert failed.is_error
    assert not resumed.is_error and resumed.structured_content == replayed.structured_content
    assert effects.runs == Counter({"reserve:o1": 1, "charge:o1": 1})
    assert _kinds(events)["step_replayed"] == 1


# ---------------------------------------------------------------------- execute (in process)


async def test_a_waiting_duplicate_resumes_when_the_holder_fails_after_a_step() -> None:
    effects = Effects()
    effects.fail_once.add("o1")
    manager = Manager(MemoryStore(), Options(wait=Wait(timeout=10)))
    holding = asyncio.Event()

    async def holder() -> dict[str, Any]:
        await step("reserve", lambda: effects.reserve("o1"))
        holding.set()
        await asyncio.sleep(0.1)  # the duplicate is waiting by now
        raise ConnectionError("the charge service is down")

    first = asyncio.create_task(manager.execute({"order": "o1"}, holder, timeout=10))
    await holding.wait()
    waiter = asyncio.create_task(
        manager.execute({"order": "o1"}, lambda: effects.place("o2-never"), timeout=10)
    )
    results = await asyncio.gather(first, waiter, return_exceptions=True)

    assert isinstance(results[0], ConnectionError)
    # The waiter claimed for itself and resumed: its "reserve" step was replayed (the
    # holder's result), so only its charge ran.
    assert results[1] == {"order": "o2-never", "reservation": "res-o1-1", "charge": "ch-o2-never-1"}
    assert effects.runs == Counter({"reserve:o1": 1, "charge:o2-never": 1})


async def test_a_retry_that_returns_before_its_recorded_steps_completes_the_record() -> None:
    manager = Manager(MemoryStore(), Options())
    effects = Effects()

    async def two_steps() -> str:
        await step("reserve", lambda: effects.reserve("o1"))
        await step("charge", lambda: effects.charge("o1"))
        raise ConnectionError("after both steps")

    async def returns_early() -> str:
        return "changed my mind"

    with pytest.raises(ConnectionError):
        await manager.execute({"order": "o1"}, two_steps, timeout=10)
    assert await manager.execute({"order": "o1"}, returns_early, timeout=10) == "changed my mind"
    # Completed (G2): later calls replay, and no step runs again.
    assert await manager.execute({"order": "o1"}, two_steps, timeout=10) == "changed my mind"
    assert effects.runs == Counter({"reserve:o1": 1, "charge:o1": 1})
