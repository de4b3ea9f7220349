"""OpenTelemetry through the integrations: attributes on the framework's span and the call
span, no span of their own.  The HTTP server is a real aiohttp server whose outer middleware
opens the server span, as the framework's instrumentation would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_otel import Otel, otel

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.aws_lambda import process_batch

__all__ = ["otel"]

EVENTS = Path(__file__).parent / "events"


@pytest.fixture
async def server(otel: Otel) -> AsyncIterator[str]:
    tracer = otel.tracer_provider.get_tracer("framework")

    @web.middleware
    async def server_span(request: web.Request, handler: Any) -> web.StreamResponse:
        with tracer.start_as_current_span(f"{request.method} server") as span:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            return response

    async def create(request: web.Request) -> web.Response:
        return web.json_response({"order": request.match_info["id"]}, status=201)

    manager = Manager(MemoryStore(), Options(key_prefix="api", telemetry=otel.telemetry))
    app = web.Application(middlewares=[server_span, idempotency_middleware(manager)])
    app.router.add_post("/orders/{id}", create)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield str(test_server.make_url("")).rstrip("/")
    finally:
        await test_server.close()


async def test_http_call_span_has_route_method_status_and_replay_marks_the_server_span(
    server: str, otel: Otel
) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        for _ in range(2):
            response = await client.post("/orders/7", headers={"Idempotency-Key": "k-1"})
            assert response.status_code == 201

    spans = otel.spans.get_finished_spans()
    assert [s.name for s in spans] == [
        "idempotency api",
        "POST server",
        "idempotency api",
        "POST server",
    ]  # one call span per request, no span of the integration's own
    first_call, first_server, replay_call, replay_server = spans
    assert first_call.parent is not None
    assert first_call.parent.span_id == first_server.context.span_id
    assert first_call.attributes is not None and replay_call.attributes is not None
    assert first_call.attributes["http.route"] == "/orders/{id}"
    assert first_call.attributes["http.request.method"] == "POST"
    assert first_call.attributes["http.response.status_code"] == 201
    assert first_call.attributes["idempotency.outcome"] == "claimed"
    assert replay_call.attributes["http.route"] == "/orders/{id}"
    assert replay_call.attributes["idempotency.outcome"] == "replayed"
    assert first_server.attributes is not None and replay_server.attributes is not None
    assert "idempotency.http.replayed" not in first_server.attributes
    assert replay_server.attributes["idempotency.http.replayed"] is True
    assert replay_server.attributes["http.route"] == "/orders/{id}"


async def test_batch_records_carry_their_item_id_and_the_invocation_span_the_counts(
    otel: Otel,
) -> None:
    manager = Manager(
        MemoryStore(),
        Options(key_prefix="ship", event_key_jmespath="body.order_id", telemetry=otel.telemetry),
    )

    async def ship(record: dict[str, Any]) -> None:
        if record["body"]["quantity"] <= 0:
            raise ValueError("nothing to ship")

    event = json.loads((EVENTS / "sqs.json").read_text())
    tracer = otel.tracer_provider.get_tracer("lambda")
    with tracer.start_as_current_span("invocation"):
        await process_batch(manager, event, ship)

    spans = otel.spans.get_finished_spans()
    invocation = next(s for s in spans if s.name == "invocation")
    calls = [s for s in spans if s.name == "idempotency ship"]
    by_item = {
        s.attributes["idempotency.batch.item.id"]: s.attributes["idempotency.outcome"]  # type: ignore[index]
        for s in calls
    }
    ids = [record["messageId"] for record in event["Records"]]
    assert by_item == {ids[0]: "claimed", ids[1]: "failed", ids[2]: "claimed"}
    assert all(
        s.parent is not None and s.parent.span_id == invocation.context.span_id for s in calls
    )
    assert invocation.attributes is not None
    assert invocation.attributes["idempotency.batch.size"] == 3
    assert invocation.attributes["idempotency.batch.failures"] == 1
