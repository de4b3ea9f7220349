"""Hostile and unusual HTTP inputs, each through a real server on loopback (uvicorn, aiohttp).

Tenants routed by host, bodies a handler reads itself, stored responses written by someone
else, UTF-16 JSON, repeated query parameters, ASGI messages the middleware does not know,
and a stream cut short on a server before ASGI 2.4.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import pytest
from _http_apps import SERVERS, Served, serve_aio, serve_asgi
from aiohttp import BodyPartReader, web
from fastapi import APIRouter, FastAPI
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Host, Route, Router
from support import RecordingStore
from test_otel import Otel, otel

from idempotency_async import Manager, MemoryStore, Options, errors
from idempotency_async._json import nesting_depth
from idempotency_async.integrations.aiohttp import idempotency_middleware
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Claim, Completion

__all__ = ["otel"]

Start = Callable[..., Awaitable[Served]]
CALLER = "the-same-caller"


@pytest.fixture(params=sorted(SERVERS))
async def start(request: pytest.FixtureRequest) -> AsyncIterator[Start]:
    async with AsyncExitStack() as stack:

        async def _start(store: Any = None) -> Served:
            return await stack.enter_async_context(SERVERS[request.param](None, store))

        yield _start


def _key(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-Tenant": "t1"}


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


def _not_stored(response: httpx.Response) -> bool:
    return (
        response.headers.get("idempotency-response-stored") == "false"
        and response.headers["content-type"] == "application/problem+json"
    )


# ---------------------------------------------------------------------- tenants by host


def _host_starlette(calls: Counter[str]) -> Starlette:
    async def create(request: Request) -> Response:
        calls[request.headers["host"]] += 1
        return JSONResponse({"host": request.headers["host"], "run": calls.total()}, 201)

    orders = Router([Route("/orders", create, methods=["POST"])])
    return Starlette(
        routes=[
            Host("a.example", app=orders),
            Host("b.example", app=orders),
            Host("{tenant}.example.com", app=orders),
        ],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                caller_scope=lambda request: CALLER,
            )
        ],
    )


def _host_aiohttp(calls: Counter[str]) -> web.Application:
    async def create(request: web.Request) -> web.Response:
        calls[request.headers["host"]] += 1
        return web.json_response(
            {"host": request.headers["host"], "run": calls.total()}, status=201
        )

    root = web.Application(
        middlewares=[
            idempotency_middleware(Manager(MemoryStore()), caller_scope=lambda request: CALLER)
        ]
    )
    for domain in ("a.example", "b.example", "*.example.com"):
        tenant = web.Application()
        tenant.router.add_post("/orders", create)
        root.add_domain(domain, tenant)
    return root


@pytest.mark.parametrize("framework", ["starlette", "aiohttp"])
async def test_tenants_routed_by_host_never_share_a_response(framework: str) -> None:
    calls: Counter[str] = Counter()
    serve = (
        serve_asgi(_host_starlette(calls))
        if framework == "starlette"
        else serve_aio(_host_aiohttp(calls))
    )
    async with serve as base_url, httpx.AsyncClient(base_url=base_url, timeout=10) as client:

        async def post(host: str) -> httpx.Response:
            return await client.post(
                "/orders", json={"sku": "A"}, headers={"Idempotency-Key": "k", "Host": host}
            )

        answers = {host: await post(host) for host in ("a.example", "b.example")}
        # One pattern, many tenants: the concrete host is what keeps them apart.
        answers.update({host: await post(host) for host in ("x.example.com", "y.example.com")})
        # The same host however it is spelled (case, the scheme's default port): a replay.
        again = await post("A.Example:80")

    for host, answer in answers.items():
        assert answer.status_code == 201, host
        assert not _replayed(answer), host
        assert answer.json()["host"] == host
    assert calls == dict.fromkeys(answers, 1)
    assert _replayed(again) and again.json() == answers["a.example"].json()


async def test_aiohttp_works_out_host_routing_once_per_application() -> None:
    calls: Counter[str] = Counter()
    root = _host_aiohttp(calls)
    looked_at = Counter[str]()
    for resource in root.router.resources():
        # Counts how often the middleware inspects the root's routes; answers unchanged.
        def counted(resource: Any = resource, get_info: Any = resource.get_info) -> Any:
            looked_at[resource.canonical] += 1
            return get_info()

        resource.get_info = counted
    async with (
        serve_aio(root) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        answers = [
            await client.post(
                "/orders", json={"n": n}, headers={"Idempotency-Key": f"k{n}", "Host": host}
            )
            for n, host in enumerate(["a.example", "b.example", "x.example.com"] * 3)
        ]
    assert [answer.status_code for answer in answers] == [201] * 9
    assert [answer.json()["host"] for answer in answers] == [
        "a.example",
        "b.example",
        "x.example.com",
    ] * 3
    # Once per chain of applications (three tenants), not once per request (nine).
    assert looked_at
    assert max(looked_at.values()) <= 3, looked_at


async def test_aiohttp_413_names_the_applications_smaller_limit() -> None:
    async def create(request: web.Request) -> web.Response:
        return web.json_response({"size": len(await request.read())}, status=201)

    app = web.Application(
        client_max_size=1000,
        middlewares=[idempotency_middleware(Manager(MemoryStore()), max_body_bytes=50_000)],
    )
    app.router.add_post("/orders", create)
    async with (
        serve_aio(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        small = await client.post("/orders", content=b"x" * 900, headers=_key("small"))
        large = await client.post("/orders", content=b"x" * 2000, headers=_key("large"))
    assert small.status_code == 201 and small.json() == {"size": 900}
    assert large.status_code == 413
    detail = large.json()["detail"]
    assert "1000 bytes" in detail and "50000" not in detail, detail


# ---------------------------------------------------------------------- aiohttp bodies

_FORM = {"name": "Zoë", "qty": "2"}
_FILE = b"line one\nline two\n\x00\xff binary tail"
_JSON = {"sku": "A", "note": "ünïcode"}


async def _seen(request: web.Request) -> Any:
    """What the handler read, however the route reads it."""
    how = request.match_info["how"]
    if how == "read":
        return base64.b64encode(await request.read()).decode()
    if how == "text":
        return await request.text()
    if how == "json":
        return await request.json()
    if how == "post":
        form = await request.post()
        return {
            name: value if isinstance(value, str) else base64.b64encode(value.file.read()).decode()
            for name, value in form.items()
        }
    if how == "multipart":
        reader = await request.multipart()
        parts = {}
        while (part := await reader.next()) is not None:
            assert isinstance(part, BodyPartReader)
            parts[part.name or ""] = base64.b64encode(await part.read()).decode()
        return parts
    assert how == "content"
    chunks = [line async for line in request.content]
    return base64.b64encode(b"".join(chunks)).decode()


def _body_app(calls: Counter[str]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        calls[request.match_info["how"]] += 1
        return web.json_response({"seen": await _seen(request)}, status=201)

    app = web.Application(middlewares=[idempotency_middleware(Manager(MemoryStore()))])
    app.router.add_post("/read/{how}", handler)
    return app


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


_SENDS: dict[str, tuple[str, dict[str, Any], Any]] = {
    # how the handler reads: (the route, what the client sends, what the handler must see)
    "read": ("read", {"content": _FILE}, _b64(_FILE)),
    "text": ("text", {"content": "Zoë's order".encode()}, "Zoë's order"),
    "json": ("json", {"json": _JSON}, _JSON),
    "form": ("post", {"data": _FORM}, _FORM),
    "multipart-post": (
        "post",
        {"data": _FORM, "files": {"upload": ("f.bin", _FILE)}},
        {**_FORM, "upload": _b64(_FILE)},
    ),
    "multipart": (
        "multipart",
        {"data": _FORM, "files": {"upload": ("f.bin", _FILE)}},
        {**{name: _b64(value.encode()) for name, value in _FORM.items()}, "upload": _b64(_FILE)},
    ),
    "content": ("content", {"content": _FILE}, _b64(_FILE)),
}


@pytest.mark.parametrize("case", sorted(_SENDS))
async def test_aiohttp_handler_reads_the_body_the_client_sent_however_it_reads(case: str) -> None:
    how, send, expected = _SENDS[case]
    # The same bytes every time (httpx draws a new multipart boundary per request).
    built = httpx.Request("POST", "http://x/", **send)
    media = {"content-type": built.headers.get("content-type", "application/octet-stream")}
    send = {"content": built.read(), "headers": media}
    calls: Counter[str] = Counter()
    async with (
        serve_aio(_body_app(calls)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        keyed = {**send["headers"], "Idempotency-Key": case}
        first = await client.post(f"/read/{how}", content=send["content"], headers=keyed)
        again = await client.post(f"/read/{how}", content=send["content"], headers=keyed)
        # Without a key the handler reads the same, as it always did.
        plain = await client.post(f"/read/{how}", **send)

    assert first.status_code == 201, first.text
    assert first.json() == {"seen": expected} == plain.json()
    assert _replayed(again) and again.json() == first.json()
    assert calls[how] == 2  # the keyed request once, the plain one once


# ---------------------------------------------------------------------- stored responses


async def _overwrite(store: RecordingStore, response: Any) -> None:
    """Replace the response of the last claimed record, as another writer could."""
    key = store.claims[-1].key
    now = time.time()
    verdict = await store.inner.get(key, now=now)
    assert verdict.record is not None
    validation = verdict.record.validation
    await store.inner.force_release(key)
    await store.inner.claim(Claim(key, "other-writer", now, 30.0, 3600.0, validation))
    encoded = orjson.dumps(response)
    written = await store.inner.complete(
        Completion(key, "other-writer", now, 3600.0, validation, encoded, response)
    )
    assert written.value == "response"


def _good(**changes: Any) -> dict[str, Any]:
    stored = {
        "v": 1,
        "status": 201,
        "headers": [["content-type", "application/json"]],
        "body_b64": _b64(b'{"forged": true}'),
    }
    stored.update(changes)
    return {name: value for name, value in stored.items() if value is not None}


_MALFORMED = {
    "status-not-a-number": _good(status="201 OK"),
    "status-1000": _good(status=1000),
    "status-a-bool": _good(status=True),
    "headers-a-string": _good(headers="content-type: application/json"),
    "no-body": {"v": 1, "status": 201, "headers": []},
    "body-not-base64": _good(body_b64="%%%"),
    "body-on-a-204": _good(status=204),
    "crlf-in-a-header": _good(headers=[["location", "/x\r\nSet-Cookie: stolen=1"]]),
    "bad-header-name": _good(headers=[["loca tion", "/x"]]),
    "set-cookie": _good(headers=[["set-cookie", "session=someone-else"]]),
    "not-an-http-response": ["just", "a", "list"],
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
async def test_malformed_stored_response_answers_not_stored(start: Start, case: str) -> None:
    store = RecordingStore(MemoryStore())
    served = await start(store=store)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        first = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key(case))
        assert first.status_code == 201
        await _overwrite(store, _MALFORMED[case])
        again = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key(case))
        # The connection is still usable: nothing broke the response framing.
        after = await client.post("/orders/o-2", json={"sku": "A"}, headers=_key(case + "-2"))

    assert again.status_code < 500
    assert _not_stored(again), (again.status_code, again.headers, again.text)
    assert "set-cookie" not in again.headers and b"forged" not in again.content
    assert after.status_code == 201
    assert sum(served.calls.values()) == 2  # the malformed record never re-runs the handler


async def test_replayed_headers_pass_the_allow_list_again(start: Start) -> None:
    store = RecordingStore(MemoryStore())
    served = await start(store=store)
    stored = _good(headers=[["Content-Type", "application/json"], ["x-internal", "secret"]])
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("allow"))
        await _overwrite(store, stored)
        again = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("allow"))

    assert again.status_code == 201 and _replayed(again)
    assert again.json() == {"forged": True}
    assert again.headers["content-type"] == "application/json"
    assert "x-internal" not in again.headers


async def test_inconsistent_record_is_503_retried_after_a_minute(start: Start) -> None:
    store = RecordingStore(MemoryStore())
    store.fail_on["claim"] = errors.InconsistentStateError("record k: owner is a number")
    served = await start(store=store)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        answer = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("i"))

    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/problem+json"
    assert int(answer.headers["retry-after"]) >= 60
    assert "owner" not in answer.text  # the store's words are for the operator's log
    assert not served.calls


# ---------------------------------------------------------------------- JSON encodings


def _hidden_depth_utf16(depth: int) -> bytes:
    """UTF-16 JSON nested ``depth`` deep whose brackets hide from a count on raw bytes:
    U+2200 encodes as the bytes 00 22, a quote when the bytes are read as UTF-8."""
    text = '["\u2200", ' + "[" * depth + "]" * depth + ', "x"]'
    return text.encode("utf-16-le")


def test_the_utf16_body_hides_its_depth_from_a_byte_count() -> None:
    body = _hidden_depth_utf16(450)
    assert nesting_depth(body) < 10  # what the byte count saw
    assert nesting_depth(body.decode("utf-16-le")) == 451
    assert json.loads(body) is not None  # and yet the parser accepts it


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
async def test_json_in_any_encoding_is_held_to_the_nesting_limit(
    start: Start, encoding: str
) -> None:
    served = await start()
    deep = _hidden_depth_utf16(450).decode("utf-16-le").encode(encoding)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        answer = await client.post(
            "/orders/o-1",
            content=deep,
            headers={**_key(encoding), "content-type": "application/json"},
        )

    assert answer.status_code == 400
    assert answer.json()["title"] == "Request body nested too deeply"
    assert not served.calls


async def test_shallow_utf16_json_is_fingerprinted_as_its_value(start: Start) -> None:
    """The same JSON value in UTF-16 and UTF-8 is the same request (a replay, no 422)."""
    served = await start()
    body = {"sku": "A"}
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        first = await client.post("/orders/o-1", json=body, headers=_key("enc"))
        again = await client.post(
            "/orders/o-1",
            content=json.dumps(body).encode("utf-16"),
            headers={**_key("enc"), "content-type": "application/json"},
        )

    assert first.status_code == 201 and again.status_code == 201 and _replayed(again)


# ---------------------------------------------------------------------- query order


async def test_reordered_values_of_a_repeated_query_name_are_a_different_request(
    start: Start,
) -> None:
    served = await start()
    body = {"sku": "A"}
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
        first = await client.post("/orders/o-1?account=A&account=B", json=body, headers=_key("q"))
        swapped = await client.post("/orders/o-1?account=B&account=A", json=body, headers=_key("q"))
        # Names in another order (a client building its query from a map): the same request.
        mapped = await client.post("/orders/o-1?z=1&a=2", json=body, headers=_key("m"))
        remapped = await client.post("/orders/o-1?a=2&z=1", json=body, headers=_key("m"))

    assert first.status_code == 201 and swapped.status_code == 422
    assert mapped.status_code == 201 and _replayed(remapped)


# ---------------------------------------------------------------------- Retry-After

LEASE = 30.0


def _busy_apps(started: asyncio.Event, release: asyncio.Event) -> dict[str, Any]:
    """The same endpoint on both frameworks: it runs until ``release`` is set."""

    async def work() -> None:
        started.set()
        await release.wait()

    async def starlette_endpoint(request: Request) -> Response:
        await work()
        return JSONResponse({"done": True}, 201)

    async def aiohttp_endpoint(request: web.Request) -> web.Response:
        await work()
        return web.json_response({"done": True}, status=201)

    options: dict[str, Any] = {"caller_scope": lambda request: CALLER, "request_timeout": LEASE}
    starlette = Starlette(
        routes=[Route("/work", starlette_endpoint, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, manager=Manager(MemoryStore()), **options)],
    )
    aio = web.Application(middlewares=[idempotency_middleware(Manager(MemoryStore()), **options)])
    aio.router.add_post("/work", aiohttp_endpoint)
    return {"starlette": lambda: serve_asgi(starlette), "aiohttp": lambda: serve_aio(aio)}


@pytest.mark.parametrize("framework", ["starlette", "aiohttp"])
async def test_retry_after_follows_the_work_not_the_lease(framework: str) -> None:
    """A 409's Retry-After is how long the first request has run so far (at least 1 s):
    a duplicate arriving later is told to wait longer, and never the whole lease."""
    started, release = asyncio.Event(), asyncio.Event()
    headers = {"Idempotency-Key": "busy"}
    async with (
        _busy_apps(started, release)[framework]() as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        first = asyncio.create_task(client.post("/work", headers=headers))
        await asyncio.wait_for(started.wait(), 10)
        running = time.monotonic()
        early = await client.post("/work", headers=headers)
        await asyncio.sleep(max(0.0, 1.3 - (time.monotonic() - running)))
        late = await client.post("/work", headers=headers)
        late_at = time.monotonic() - running
        release.set()
        assert (await first).status_code == 201

    assert early.status_code == late.status_code == 409
    early_wait, late_wait = int(early.headers["retry-after"]), int(late.headers["retry-after"])
    assert early_wait == 1  # it had just started
    # It had run at least 1.3 s (2 once rounded up), at most as long as this test waited.
    assert 2 <= late_wait <= math.ceil(late_at)
    assert late_wait < LEASE - late_at  # far from the lease left


# ---------------------------------------------------------------------- telemetry


async def test_http_409_422_and_replays_are_outcomes_not_error_spans(otel: Otel) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def create(request: web.Request) -> web.Response:
        started.set()
        await release.wait()
        return web.json_response({"ok": True}, status=201)

    manager = Manager(MemoryStore(), Options(key_prefix="api", telemetry=otel.telemetry))
    app = web.Application(middlewares=[idempotency_middleware(manager, caller_scope=None)])
    app.router.add_post("/orders", create)
    async with (
        serve_aio(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        first = asyncio.create_task(
            client.post("/orders", json={"n": 1}, headers={"Idempotency-Key": "k"})
        )
        await asyncio.wait_for(started.wait(), 10)
        busy = await client.post("/orders", json={"n": 1}, headers={"Idempotency-Key": "k"})
        release.set()
        assert (await first).status_code == 201
        replay = await client.post("/orders", json={"n": 1}, headers={"Idempotency-Key": "k"})
        reused = await client.post("/orders", json={"n": 2}, headers={"Idempotency-Key": "k"})

    assert (busy.status_code, replay.status_code, reused.status_code) == (409, 201, 422)
    outcomes = {}
    for span in otel.calls():
        assert span.attributes is not None
        outcomes[span.attributes["idempotency.outcome"]] = span
    assert set(outcomes) == {
        "claimed",
        "rejected_in_progress",
        "replayed",
        "rejected_payload_mismatch",
    }
    for outcome, span in outcomes.items():
        assert span.status.status_code is StatusCode.UNSET, outcome
        assert "exception" not in [event.name for event in span.events], outcome
        assert span.attributes is not None and "error.type" not in span.attributes, outcome


# ---------------------------------------------------------------------- ASGI messages


class _Server:
    """Between uvicorn and the app: a server feature uvicorn lacks, or an older ASGI spec.

    ``early_hints``: advertise the ``http.response.early_hint`` extension and take those
    messages (as a server supporting them would send a 103).  ``spec_version``: the ASGI
    spec version the app is told the server implements.
    """

    def __init__(
        self, app: Any, *, early_hints: bool = False, spec_version: str | None = None
    ) -> None:
        self.app = app
        self.early_hints = early_hints
        self.spec_version = spec_version
        self.hints: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        if self.spec_version is not None:
            scope["asgi"] = {**scope.get("asgi", {}), "spec_version": self.spec_version}
        if self.early_hints:
            scope["extensions"] = {
                **(scope.get("extensions") or {}),
                "http.response.early_hint": {},
            }

        async def server_send(message: Any) -> None:
            if message["type"] == "http.response.early_hint":
                self.hints.append(message)
                return
            await send(message)

        await self.app(scope, receive, server_send)


async def test_early_hint_before_a_stream_keeps_it_recorded() -> None:
    runs: list[int] = []

    async def hinted(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        runs.append(1)
        await send({"type": "http.response.early_hint", "links": [b"</app.css>; rel=preload"]})
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        for part in (b"first ", b"second ", b"third"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    middleware = IdempotencyMiddleware(
        hinted, manager=Manager(MemoryStore()), caller_scope=lambda request: CALLER
    )
    server = _Server(middleware, early_hints=True)
    async with (
        serve_asgi(server) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        first = await client.post("/hinted", headers={"Idempotency-Key": "h"})
        again = await client.post("/hinted", headers={"Idempotency-Key": "h"})

    assert first.status_code == 201 and first.text == "first second third"
    assert len(server.hints) == 1  # forwarded to the server as it was
    assert again.status_code == 201 and _replayed(again)
    assert again.text == first.text
    assert runs == [1]


async def test_stream_cut_before_its_first_chunk_on_asgi_2_3_is_not_replayed_as_empty() -> None:
    """On servers before ASGI 2.4 Starlette stops a stream when the client leaves, without
    a last body message: the response never ended, so it is no empty 200 to replay."""
    streaming = asyncio.Event()
    runs: list[int] = []

    async def slow(request: Request) -> Response:
        runs.append(1)

        async def chunks() -> AsyncIterator[bytes]:
            streaming.set()
            await asyncio.sleep(30)
            yield b"never sent"

        return StreamingResponse(chunks(), media_type="text/plain")

    app = Starlette(
        routes=[Route("/slow", slow, methods=["POST"])],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                caller_scope=lambda request: CALLER,
            )
        ],
    )
    async with serve_asgi(_Server(app, spec_version="2.3")) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /slow HTTP/1.1\r\nHost: t\r\nIdempotency-Key: cut\r\nContent-Length: 0\r\n\r\n"
        )
        await writer.drain()
        await asyncio.wait_for(streaming.wait(), 10)
        writer.transport.abort()  # the client leaves before the first chunk
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            deadline = time.monotonic() + 10
            while True:
                again = await client.post("/slow", headers={"Idempotency-Key": "cut"})
                if again.status_code != 409 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)

    assert runs == [1]
    assert _not_stored(again), (again.status_code, again.headers, again.text)
    assert again.status_code == 200  # the status the endpoint started, not replayed as a body
    assert (
        "stopped before its end" in again.json()["detail"]
        or "disconnected" in again.json()["detail"]
    )


async def test_fastapi_routes_of_an_included_router_are_idempotent() -> None:
    # FastAPI 0.16x includes a router as a single route that matches through its routes
    # as included; the middleware must find the route (template and marker) inside it.
    runs: Counter[str] = Counter()
    inner, outer = APIRouter(), APIRouter()

    @inner.post("/orders/{order_id}", status_code=201)
    async def create(order_id: str, key: IdempotencyKey) -> dict[str, int]:
        runs[order_id] += 1
        return {"run": runs[order_id]}

    outer.include_router(inner, prefix="/v1")
    app = FastAPI()
    app.include_router(outer, prefix="/api")
    middleware = IdempotencyMiddleware(
        app, manager=Manager(MemoryStore()), paths=(), caller_scope=lambda request: "t"
    )
    async with serve_asgi(middleware) as url, httpx.AsyncClient(base_url=url) as client:
        answers = await asyncio.gather(
            *(client.post("/api/v1/orders/o-1", headers={"Idempotency-Key": "k"}) for _ in range(4))
        )
        replay = await client.post("/api/v1/orders/o-1", headers={"Idempotency-Key": "k"})
        missing = await client.post("/api/v1/orders/o-1")

    assert runs["o-1"] == 1, [(a.status_code, a.text) for a in answers]
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert [a.status_code for a in answers].count(201) >= 1
    assert missing.status_code == 400  # the route's marker requires the key
    key = middleware.key_for("POST", "/api/v1/orders/{order_id}", "k", caller="t")
    assert await middleware.manager.force_release(key) is not None  # stored under the template
