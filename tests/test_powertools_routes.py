"""idempotent_route: Powertools Event Handler routes resolved with ``resolve_async``.

Every test runs aws-lambda-powertools' own resolvers (REST API and HTTP API, on the events
in tests/events) with the middleware on a route; the last ones share a moto table with
Powertools' own synchronous ``@idempotent`` handler, in both directions.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.event_handler import (
    ALBResolver,
    APIGatewayHttpResolver,
    APIGatewayRestResolver,
    Response,
)
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver
from aws_lambda_powertools.event_handler.exceptions import BadRequestError

from idempotency_async import Manager, MemoryStore, Options, Redaction, Wait
from idempotency_async.deadlines import current_deadline
from idempotency_async.errors import ConfigError, DeadlineExceededError
from idempotency_async.integrations.powertools import (
    REDACTED_HEADER,
    REPLAYED_HEADER,
    idempotent_route,
)

EVENTS = Path(__file__).parent / "events"
KEY = "powertools_json(body).order_id"


class LambdaContext:
    function_name = "orders-fn"
    aws_request_id = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def _event(name: str, **body: Any) -> dict[str, Any]:
    """The event, with its own request id (a retry is a new delivery) and ``body``."""
    event: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    if body:
        event["body"] = json.dumps({**json.loads(event["body"]), **body})
    return event


def _headers(response: dict[str, Any]) -> dict[str, str]:
    """The response's headers, whichever field the resolver used (REST: multiValueHeaders)."""
    single = {name.lower(): value for name, value in (response.get("headers") or {}).items()}
    multi = response.get("multiValueHeaders") or {}
    return single | {name.lower(): ",".join(values) for name, values in multi.items()}


RESOLVERS = {
    "rest": (APIGatewayRestResolver, "api_gateway_rest_v1"),
    "http": (APIGatewayHttpResolver, "api_gateway_http_v2"),
    "alb": (ALBResolver, "alb"),
}


@pytest.fixture(params=sorted(RESOLVERS))
def kind(request: pytest.FixtureRequest) -> tuple[type[ApiGatewayResolver], str]:
    return RESOLVERS[request.param]  # type: ignore[return-value]


def _orders_app(
    resolver: type[ApiGatewayResolver], manager: Manager, runs: list[str], **route: Any
) -> ApiGatewayResolver:
    app = resolver()

    @app.post("/orders", middlewares=[idempotent_route(manager, **route)])
    async def create_order() -> tuple[dict[str, Any], int]:
        order = app.current_event.json_body
        runs.append(order["order_id"])
        await asyncio.sleep(0)
        if order.get("fail") == "raise":
            raise BadRequestError("card declined")
        if order.get("fail") == "5xx":
            return {"error": "downstream"}, 502
        return {"order": order["order_id"], "charge": f"ch_{len(runs)}"}, 201

    return app


def _manager(**options: Any) -> Manager:
    return Manager(
        MemoryStore(), Options(key_format="powertools-python", event_key_jmespath=KEY, **options)
    )


async def test_a_duplicate_delivery_replays_the_routes_response(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    runs: list[str] = []
    app = _orders_app(resolver, _manager(), runs)
    first = await app.resolve_async(_event(event_name), LambdaContext())
    again = await app.resolve_async(_event(event_name), LambdaContext())
    other = await app.resolve_async(_event(event_name, order_id="ord-2"), LambdaContext())
    assert first["statusCode"] == again["statusCode"] == other["statusCode"] == 201
    assert json.loads(first["body"]) == json.loads(again["body"])
    assert json.loads(first["body"]) == {"order": "ord-1001", "charge": "ch_1"}
    assert _headers(again)[REPLAYED_HEADER.lower()] == "true"
    assert REPLAYED_HEADER.lower() not in _headers(first)
    assert _headers(again)["content-type"] == _headers(first)["content-type"]
    assert runs == ["ord-1001", "ord-2"]


async def test_keys_carry_powertools_prefix_for_the_route_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    store = MemoryStore()
    manager = Manager(store, Options(key_format="powertools-python", event_key_jmespath=KEY))
    runs: list[str] = []
    app = _orders_app(APIGatewayRestResolver, manager, runs)
    await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    (key,) = list(store._entries)
    route = next(route for route in app._static_routes if route.method == "POST")
    assert key.startswith(f"orders-fn.{__name__}.{route.func.__qualname__}#")


async def test_the_same_key_with_another_payload_is_422(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    runs: list[str] = []
    app = _orders_app(resolver, _manager(payload_validation_jmespath="body"), runs)
    await app.resolve_async(_event(event_name), LambdaContext())
    changed = await app.resolve_async(_event(event_name, amount=1), LambdaContext())
    assert changed["statusCode"] == 422
    assert "application/problem+json" in _headers(changed)["content-type"]
    assert "already used with a different request" in json.loads(changed["body"])["detail"]
    assert runs == ["ord-1001"]


async def test_a_delivery_while_the_first_runs_is_409_with_retry_after(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    started, release = asyncio.Event(), asyncio.Event()
    app = resolver()
    runs: list[str] = []

    @app.post("/orders", middlewares=[idempotent_route(_manager())])
    async def create_order() -> dict[str, str]:
        runs.append("ran")
        started.set()
        await release.wait()
        return {"ok": "yes"}

    # The duplicate is resolved by a second app with the same route and middleware while
    # the first request waits (the middleware read its event before it awaited).
    first = asyncio.create_task(app.resolve_async(_event(event_name), LambdaContext()))
    await asyncio.wait_for(started.wait(), 5)
    other = resolver()
    other.post("/orders", middlewares=app._static_routes[0].middlewares)(create_order)
    busy = await other.resolve_async(_event(event_name), LambdaContext())
    release.set()
    done = await first
    assert busy["statusCode"] == 409
    assert 1 <= int(_headers(busy)["retry-after"]) <= 30
    assert done["statusCode"] == 200
    assert runs == ["ran"]


async def test_a_raised_error_releases_the_key_and_reaches_the_exception_handlers(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    runs: list[str] = []
    app = _orders_app(resolver, _manager(), runs)
    failed = await app.resolve_async(_event(event_name, fail="raise"), LambdaContext())
    retried = await app.resolve_async(_event(event_name, fail="raise"), LambdaContext())
    assert failed["statusCode"] == retried["statusCode"] == 400  # Powertools' own mapping
    assert len(runs) == 2


async def test_a_server_error_is_answered_as_it_is_and_not_replayed(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    runs: list[str] = []
    app = _orders_app(resolver, _manager(), runs)
    first = await app.resolve_async(_event(event_name, fail="5xx"), LambdaContext())
    again = await app.resolve_async(_event(event_name, fail="5xx"), LambdaContext())
    assert first["statusCode"] == again["statusCode"] == 502
    assert REPLAYED_HEADER.lower() not in _headers(again)
    assert len(runs) == 2


async def test_a_request_without_a_key_is_400_with_raise_on_no_key() -> None:
    runs: list[str] = []
    app = _orders_app(APIGatewayRestResolver, _manager(raise_on_no_key=True), runs)
    event = _event("api_gateway_rest_v1")
    event["body"] = json.dumps({"amount": 1})
    answer = await app.resolve_async(event, LambdaContext())
    assert answer["statusCode"] == 400 and runs == []


async def test_bytes_and_text_bodies_replay_byte_for_byte() -> None:
    app = APIGatewayRestResolver()
    runs: list[int] = []

    @app.post("/orders", middlewares=[idempotent_route(_manager())])
    async def create_order() -> Response[Any]:
        runs.append(1)
        return Response(200, "application/octet-stream", body=b"\x00\xffpdf", headers={"X-A": "1"})

    first = await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    again = await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    assert first["isBase64Encoded"] is again["isBase64Encoded"] is True
    assert first["body"] == again["body"]
    assert _headers(again)["x-a"] == "1"
    assert runs == [1]


async def test_a_response_too_large_to_store_is_not_run_again(
    kind: tuple[type[ApiGatewayResolver], str],
) -> None:
    resolver, event_name = kind
    app = resolver()
    runs: list[int] = []
    manager = Manager(
        MemoryStore(max_response_bytes=256),
        Options(key_format="powertools-python", event_key_jmespath=KEY),
    )

    @app.post("/orders", middlewares=[idempotent_route(manager)])
    async def create_order() -> dict[str, str]:
        runs.append(1)
        return {"receipt": "x" * 1000}

    first = await app.resolve_async(_event(event_name), LambdaContext())
    again = await app.resolve_async(_event(event_name), LambdaContext())
    assert first["statusCode"] == 200 and len(json.loads(first["body"])["receipt"]) == 1000
    assert again["statusCode"] == 409  # processed, not replayable: never run twice (G2)
    assert "was processed, but its response was not stored" in json.loads(again["body"])["detail"]
    assert runs == [1]


async def test_the_replayed_header_is_the_one_given() -> None:
    runs: list[str] = []
    app = _orders_app(APIGatewayRestResolver, _manager(), runs, replayed_header="X-Replayed")
    first = await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    again = await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    assert "x-replayed" not in _headers(first)
    assert _headers(again)["x-replayed"] == "true"
    assert REPLAYED_HEADER.lower() not in _headers(again)
    assert runs == ["ord-1001"]


@pytest.mark.parametrize("name", ["Set-Cookie", "retry-after", "not a header", ""])
def test_a_replayed_header_the_route_cannot_own_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="replayed_header"):
        idempotent_route(_manager(), replayed_header=name)


def test_something_else_than_a_manager_is_refused_at_once() -> None:
    with pytest.raises(ConfigError, match=r"needs an idempotency_async\.Manager"):
        idempotent_route(MemoryStore())  # type: ignore[arg-type]


def test_a_manager_with_its_own_redaction_is_refused_with_what_to_do() -> None:
    manager = _manager(redaction=Redaction(fields=("body.secret",)))
    with pytest.raises(ConfigError, match=r"idempotent_route\(manager, redaction=Redaction"):
        idempotent_route(manager)


@pytest.mark.parametrize("field", ["status", "body", 'headers."a".b', "statusCode"])
def test_a_redacted_field_outside_headers_and_body_is_a_config_error(field: str) -> None:
    with pytest.raises(ConfigError, match="names no part of an HTTP response"):
        idempotent_route(_manager(), redaction=Redaction(fields=(field,)))


def _secret_app(manager: Manager, runs: list[int], redaction: Redaction, body: Any) -> Any:
    app = APIGatewayRestResolver()

    @app.post("/credentials", middlewares=[idempotent_route(manager, redaction=redaction)])
    async def mint() -> Response[Any]:
        runs.append(1)
        headers = {"X-Token": "t0k", "ETag": '"v1"'}
        return Response(201, "application/json", body=body, headers=headers)

    return app


def _credentials_event() -> dict[str, Any]:
    event = _event("api_gateway_rest_v1")
    event["path"] = event["resource"] = "/credentials"
    return event


async def test_redacted_fields_reach_the_first_caller_and_no_replay() -> None:
    store, runs = MemoryStore(), []
    manager = Manager(store, Options(event_key_jmespath=KEY))
    redaction = Redaction(fields=("body.credentials.secret", 'headers."x-token"'))
    body = {"credentials": {"id": "AK1", "secret": "s3cr3t"}}
    app = _secret_app(manager, runs, redaction, body)
    first = await app.resolve_async(_credentials_event(), LambdaContext())
    again = await app.resolve_async(_credentials_event(), LambdaContext())
    assert json.loads(first["body"]) == body and _headers(first)["x-token"] == "t0k"
    assert REDACTED_HEADER.lower() not in _headers(first)
    assert again["statusCode"] == 201
    assert json.loads(again["body"]) == {"credentials": {"id": "AK1"}}
    assert "x-token" not in _headers(again)
    assert _headers(first)["etag"] == '"v1"' and "etag" not in _headers(again)  # body changed
    assert _headers(again)[REDACTED_HEADER.lower()] == "true"
    assert "s3cr3t" not in repr(store._entries) and "t0k" not in repr(store._entries)
    assert runs == [1]


async def test_a_body_redaction_cannot_look_into_is_not_stored_and_not_run_again() -> None:
    runs: list[int] = []
    manager = Manager(MemoryStore(), Options(event_key_jmespath=KEY))
    app = _secret_app(manager, runs, Redaction(fields=("body.secret",)), "secret=s3cr3t")
    first = await app.resolve_async(_credentials_event(), LambdaContext())
    again = await app.resolve_async(_credentials_event(), LambdaContext())
    assert first["body"] == "secret=s3cr3t"
    assert again["statusCode"] == 409 and _headers(again)[REPLAYED_HEADER.lower()] == "true"
    assert "not JSON" in json.loads(again["body"])["detail"]
    assert runs == [1]


async def test_a_never_stored_route_completes_without_its_response() -> None:
    store, runs = MemoryStore(), []
    manager = Manager(store, Options(event_key_jmespath=KEY))
    app = _secret_app(manager, runs, Redaction(never_store=True), {"otp": "123456"})
    first = await app.resolve_async(_credentials_event(), LambdaContext())
    again = await app.resolve_async(_credentials_event(), LambdaContext())
    assert json.loads(first["body"]) == {"otp": "123456"}
    assert again["statusCode"] == 409
    assert "never stored" in json.loads(again["body"])["detail"]
    assert "123456" not in repr(store._entries)
    assert runs == [1]


async def test_the_invocation_deadline_is_ambient_inside_the_route() -> None:
    app = APIGatewayRestResolver()
    inner = Manager(MemoryStore(), Options())
    seen: list[float | None] = []

    async def charge() -> str:
        seen.append(current_deadline())
        return "ch_1"

    @app.post("/orders", middlewares=[idempotent_route(_manager())])
    async def create_order() -> dict[str, str]:
        seen.append(current_deadline())
        return {"charge": await inner.execute("charge-ord-1001", charge)}

    before = asyncio.get_running_loop().time()
    answer = await app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext())
    after = asyncio.get_running_loop().time()
    assert answer["statusCode"] == 200
    outer, in_call = seen
    assert outer is not None and outer == in_call
    assert before + 30 <= outer <= after + 30  # LambdaContext: 30 000 ms remaining
    assert current_deadline() is None  # not left behind after the route


async def test_a_duplicate_waiting_past_the_invocation_deadline_gets_deadline_exceeded() -> None:
    # The invocation's deadline is ambient but not a timer of its own: the waiting
    # duplicate gets the manager's error at the deadline, not a bare TimeoutError (it goes
    # out of resolve_async, as idempotent_handler's does).
    release = asyncio.Event()
    app = APIGatewayRestResolver()

    @app.post("/orders", middlewares=[idempotent_route(_manager(wait=Wait(timeout=10)))])
    async def create_order() -> dict[str, str]:
        await release.wait()
        return {"ok": "yes"}

    class Ending(LambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 200

    first = asyncio.create_task(app.resolve_async(_event("api_gateway_rest_v1"), LambdaContext()))
    await asyncio.sleep(0.05)
    other = APIGatewayRestResolver()
    other.post("/orders", middlewares=app._static_routes[0].middlewares)(create_order)
    with pytest.raises(DeadlineExceededError):
        await other.resolve_async(_event("api_gateway_rest_v1"), Ending())
    release.set()
    assert (await first)["statusCode"] == 200


# -- one table with Powertools' own synchronous @idempotent handler -----------------------


@pytest.fixture
async def shared_table(moto_endpoint: str) -> AsyncIterator[tuple[Any, str]]:
    from _moto import fresh_table, open_client

    async with open_client(moto_endpoint) as client:
        yield client, await fresh_table(client)


def _sync_powertools_handler(endpoint: str, table: str, runs: list[str]) -> Any:
    """The function before its migration: a sync route behind ``@idempotent`` on the
    handler, as Powertools' documentation shows it."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent
    from test_powertools_python_interop import powertools_layer

    app = APIGatewayRestResolver()

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        runs.append("sync")
        return {"order": app.current_event.json_body["order_id"], "charge": "ch_sync"}, 201

    def lambda_handler(event: Any, context: Any) -> Any:
        return app.resolve(event, context)

    config = IdempotencyConfig(event_key_jmespath=KEY)
    layer = powertools_layer(endpoint, table)
    return idempotent(lambda_handler, persistence_store=layer, config=config)


def _async_app(client: Any, table: str, runs: list[str]) -> ApiGatewayResolver:
    from idempotency_async.stores.dynamodb import DynamoDBStore

    store = DynamoDBStore(client, table_name=table, record_format="powertools-python")
    # The old handler's prefix: <function>.<module>.<qualname>, as @idempotent derived it.
    prefix = f"orders-fn.{__name__}.{_sync_powertools_handler.__name__}.<locals>.lambda_handler"
    options = Options(key_format="powertools-python", key_prefix=prefix, event_key_jmespath=KEY)
    return _orders_app(APIGatewayRestResolver, Manager(store, options), runs)


@pytest.mark.dynamodb
async def test_an_async_route_replays_what_the_sync_powertools_handler_stored(
    moto_endpoint: str, shared_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    client, table = shared_table
    runs: list[str] = []
    old = _sync_powertools_handler(moto_endpoint, table, runs)
    event = _event("api_gateway_rest_v1")
    stored = await asyncio.to_thread(old, copy.deepcopy(event), LambdaContext())
    replayed = await _async_app(client, table, runs).resolve_async(
        _event("api_gateway_rest_v1"), LambdaContext()
    )
    assert runs == ["sync"]  # the async route did not run
    assert replayed["statusCode"] == stored["statusCode"] == 201
    assert json.loads(replayed["body"]) == json.loads(stored["body"])
    assert _headers(replayed)["content-type"] == _headers(stored)["content-type"]
    assert _headers(replayed)[REPLAYED_HEADER.lower()] == "true"


@pytest.mark.dynamodb
async def test_the_sync_powertools_handler_replays_what_the_async_route_stored(
    moto_endpoint: str, shared_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    client, table = shared_table
    runs: list[str] = []
    first = await _async_app(client, table, runs).resolve_async(
        _event("api_gateway_rest_v1"), LambdaContext()
    )
    old = _sync_powertools_handler(moto_endpoint, table, runs)
    replayed = await asyncio.to_thread(old, _event("api_gateway_rest_v1"), LambdaContext())
    assert runs == ["ord-1001"]  # the sync handler did not run its route
    assert replayed["statusCode"] == first["statusCode"] == 201
    assert json.loads(replayed["body"]) == json.loads(first["body"])
