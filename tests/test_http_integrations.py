"""One Idempotency-Key behaviour suite, run against uvicorn+FastAPI and aiohttp on loopback."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from _http_apps import (
    BIG,
    MAX_BODY,
    MAX_RESPONSE,
    REQUEST_TIMEOUT,
    SERVERS,
    Served,
    _chunk,
    serve_aio,
    serve_asgi,
)
from aiohttp import web
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from support import RecordingStore, checkout_env

from idempotency_async import Manager, MemoryStore, Options, Wait, errors
from idempotency_async.canonical import canonical_bytes
from idempotency_async.integrations._http import HttpIdempotency, Rejection
from idempotency_async.integrations._http._fingerprint import _sliced
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.fastapi import (
    IdempotencyKey,
    OptionalIdempotencyKey,
    idempotency_openapi,
)
from idempotency_async.integrations.starlette import IdempotencyMiddleware

Start = Callable[..., Awaitable[Served]]


@pytest.fixture(params=sorted(SERVERS))
async def start(request: pytest.FixtureRequest) -> AsyncIterator[Start]:
    """Starts the parametrized server (``wait=`` seconds for duplicates, or None)."""
    async with AsyncExitStack() as stack:

        async def _start(wait: float | None = None, store: Any = None) -> Served:
            return await stack.enter_async_context(SERVERS[request.param](wait, store))

        yield _start


@pytest.fixture
async def served(start: Start) -> Served:
    return await start()


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(served) as client:
        yield client


def _client(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=served.base_url, timeout=10, limits=httpx.Limits(max_connections=100)
    )


def _key(key: str, tenant: str | None = "t1") -> dict[str, str]:
    headers = {"Idempotency-Key": key}
    if tenant is not None:
        headers["X-Tenant"] = tenant
    return headers


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


def _is_problem(response: httpx.Response) -> bool:
    return response.headers["content-type"] == "application/problem+json"


async def _concurrent_posts(served: Served, count: int) -> list[httpx.Response]:
    async with _client(served) as client:
        return await asyncio.gather(
            *(
                client.post("/orders/o-1", json={"sku": "A", "delay": 0.3}, headers=_key("c"))
                for _ in range(count)
            )
        )


async def test_concurrent_duplicates_run_the_handler_once(served: Served) -> None:
    responses = await _concurrent_posts(served, 50)

    assert served.calls == {"orders:t1:c": 1}
    originals = [r for r in responses if r.status_code == 201 and not _replayed(r)]
    assert len(originals) == 1
    for response in responses:
        if response.status_code == 409:
            assert _is_problem(response)
            assert 1 <= int(response.headers["retry-after"]) <= REQUEST_TIMEOUT
        else:
            assert response.status_code == 201
            assert response.content == originals[0].content


async def test_concurrent_duplicates_with_wait_all_get_the_response(start: Start) -> None:
    served = await start(wait=5.0)
    responses = await _concurrent_posts(served, 50)

    assert served.calls == {"orders:t1:c": 1}
    assert [r.status_code for r in responses] == [201] * 50
    assert sum(not _replayed(r) for r in responses) == 1
    assert len({r.content for r in responses}) == 1


async def test_replay_has_status_body_and_allowed_headers_but_no_cookie(
    client: httpx.AsyncClient, served: Served
) -> None:
    first = await client.post("/orders/o-7", json={"sku": "A", "delay": 0}, headers=_key("r"))
    # The quoted RFC 8941 form names the same key; key order and spacing of the JSON do not count.
    second = await client.post(
        "/orders/o-7",
        content=b'{ "delay": 0, "sku": "A" }',
        headers={**_key('"r"'), "content-type": "application/json"},
    )

    assert served.calls == {"orders:t1:r": 1}
    assert first.status_code == second.status_code == 201
    assert "set-cookie" in first.headers and "x-run" in first.headers
    assert _replayed(second) and not _replayed(first)
    assert second.content == first.content
    assert second.headers["location"] == first.headers["location"] == "/orders/o-7"
    assert second.headers["content-type"] == first.headers["content-type"]
    assert "set-cookie" not in second.headers
    assert "x-run" not in second.headers


async def test_reused_key_with_changed_body_or_query_is_422(
    client: httpx.AsyncClient, served: Served
) -> None:
    await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("u"))
    changed_body = await client.post("/orders/o-1", json={"sku": "B"}, headers=_key("u"))
    changed_query = await client.post("/orders/o-1?x=1", json={"sku": "A"}, headers=_key("u"))

    assert changed_body.status_code == changed_query.status_code == 422
    assert _is_problem(changed_body)
    detail = changed_body.json()["detail"]
    # In HTTP terms, never the middleware's internal settings.
    assert "differs from the one first sent with this Idempotency-Key" in detail
    assert "jmespath" not in detail and "fingerprint" not in detail
    assert served.calls == {"orders:t1:u": 1}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Idempotency-Key": ""},
        {"Idempotency-Key": "x" * 256},
        {"Idempotency-Key": "has space"},
        {"Idempotency-Key": '"unterminated'},
        {"Idempotency-Key": '"bad \\n escape"'},
    ],
    ids=["missing", "empty", "too-long", "space", "unterminated", "bad-escape"],
)
async def test_missing_or_invalid_key_is_400(
    client: httpx.AsyncClient, served: Served, headers: dict[str, str]
) -> None:
    response = await client.post("/orders/o-1", json={"sku": "A"}, headers=headers)

    assert response.status_code == 400
    assert _is_problem(response) and "Idempotency-Key" in response.json()["detail"]
    assert not served.calls


async def test_longest_valid_key_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("k" * 255))

    assert response.status_code == 201


async def test_handler_exception_releases_the_key(
    client: httpx.AsyncClient, served: Served
) -> None:
    first = await client.post("/flaky/raise", json={}, headers=_key("e"))
    retry = await client.post("/flaky/raise", json={}, headers=_key("e"))

    assert first.status_code == 500
    assert retry.status_code == 201 and not _replayed(retry)
    assert served.calls == {"flaky-raise:t1:e": 2}


@pytest.mark.parametrize("status", [500, 503])
async def test_server_error_response_releases_the_key(
    client: httpx.AsyncClient, served: Served, status: int
) -> None:
    first = await client.post(f"/flaky/{status}", json={}, headers=_key("s"))
    retry = await client.post(f"/flaky/{status}", json={}, headers=_key("s"))
    replay = await client.post(f"/flaky/{status}", json={}, headers=_key("s"))

    assert first.status_code == status
    assert retry.status_code == 201 and not _replayed(retry)
    assert replay.status_code == 201 and _replayed(replay)
    assert served.calls == {f"flaky-{status}:t1:s": 2}


@pytest.mark.parametrize("status", [408, 409, 425, 429])
async def test_a_retry_later_status_releases_the_key(
    client: httpx.AsyncClient, served: Served, status: int
) -> None:
    # The status policy (_responses.stores_status): these ask for the same request again,
    # so storing them would replay the refusal to the retry they ask for.
    first = await client.post(f"/flaky/{status}", json={}, headers=_key("l"))
    retry = await client.post(f"/flaky/{status}", json={}, headers=_key("l"))

    assert first.status_code == status
    assert retry.status_code == 201 and not _replayed(retry)
    assert served.calls == {f"flaky-{status}:t1:l": 2}


@pytest.mark.parametrize("status", [400, 402, 404, 422])
async def test_a_client_error_response_is_stored_and_replayed(
    client: httpx.AsyncClient, served: Served, status: int
) -> None:
    first = await client.post(f"/flaky/{status}", json={}, headers=_key("c"))
    retry = await client.post(f"/flaky/{status}", json={}, headers=_key("c"))

    assert first.status_code == retry.status_code == status
    assert _replayed(retry) and retry.json() == first.json()
    assert served.calls == {f"flaky-{status}:t1:c": 1}


async def test_http_exception_raised_by_the_endpoint_is_not_stored(
    client: httpx.AsyncClient, served: Served
) -> None:
    await client.post("/flaky/http", json={}, headers=_key("h"))  # 503: released
    raised = await client.post("/flaky/http", json={}, headers=_key("h"))
    again = await client.post("/flaky/http", json={}, headers=_key("h"))

    assert raised.status_code == again.status_code == 409
    assert not _replayed(again)
    assert served.calls == {"flaky-http:t1:h": 3}


async def test_rejected_request_is_not_stored(client: httpx.AsyncClient, served: Served) -> None:
    rejected = await client.post("/orders/o-1", json={"wrong": 1}, headers=_key("v"))
    fixed = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("v"))

    assert rejected.status_code == 422 and not _is_problem(rejected)
    assert fixed.status_code == 201 and not _replayed(fixed)
    assert served.calls == {"orders:t1:v": 1}


async def test_streaming_response_is_delivered_and_replayed(
    client: httpx.AsyncClient, served: Served
) -> None:
    expected = b"".join(_chunk(index) for index in range(5))
    first = await client.post("/stream", headers=_key("st"))
    replay = await client.post("/stream", headers=_key("st"))

    assert first.status_code == replay.status_code == 200
    assert first.content == replay.content == expected
    assert _replayed(replay)
    assert replay.headers["content-type"].startswith("text/plain")
    assert served.calls == {"stream:t1:st": 1}


async def test_stream_over_the_limit_is_delivered_but_not_stored(
    client: httpx.AsyncClient, served: Served
) -> None:
    chunks = MAX_RESPONSE // 1000 + 10
    first = await client.post(f"/stream?chunks={chunks}", headers=_key("big-stream"))
    replay = await client.post(f"/stream?chunks={chunks}", headers=_key("big-stream"))

    assert first.content == b"".join(_chunk(index) for index in range(chunks))
    assert replay.status_code == 200 and _is_problem(replay)
    assert replay.headers["idempotency-response-stored"] == "false"
    assert "not available" in replay.json()["title"]
    assert served.calls == {"stream:t1:big-stream": 1}


async def test_known_length_over_the_limit_is_flagged_on_the_live_response(
    client: httpx.AsyncClient, served: Served
) -> None:
    first = await client.post("/big", headers=_key("b"))
    replay = await client.post("/big", headers=_key("b"))

    assert len(first.content) == BIG
    assert first.headers["idempotency-response-stored"] == "false"
    assert replay.status_code == 200 and _is_problem(replay)
    assert served.calls == {"big:t1:b": 1}


async def test_caller_scopes_with_the_same_key_are_isolated(
    client: httpx.AsyncClient, served: Served
) -> None:
    one = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("same", "t1"))
    two = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("same", "t2"))
    one_again = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("same", "t1"))

    assert not _replayed(two)
    assert two.json()["run"] != one.json()["run"]
    assert _replayed(one_again) and one_again.content == one.content
    assert served.calls == {"orders:t1:same": 1, "orders:t2:same": 1}


async def test_body_over_the_limit_is_413(client: httpx.AsyncClient, served: Served) -> None:
    big = {"sku": "A" * MAX_BODY}
    declared = await client.post("/orders/o-1", json=big, headers=_key("l"))

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 100 + 1):
            yield b" " * 100

    streamed = await client.post("/orders/o-1", content=chunked(), headers=_key("l2"))

    assert declared.status_code == streamed.status_code == 413
    assert _is_problem(declared)
    assert not served.calls


class _ClaimSignal(RecordingStore):
    """Sets ``claimed`` once a claim has been answered."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.claimed = asyncio.Event()

    async def claim(self, claim: Any) -> Any:
        verdict = await super().claim(claim)
        self.claimed.set()
        return verdict


async def test_in_progress_duplicate_is_409_with_retry_after(start: Start) -> None:
    store = _ClaimSignal()
    served = await start(store=store)
    body = {"sku": "A", "delay": 0.5}
    async with _client(served) as client:
        first = asyncio.create_task(client.post("/orders/o-1", json=body, headers=_key("p")))
        # Not a fixed sleep: on a slow machine the first request may not have claimed yet,
        # and the duplicate would run the handler itself.
        await asyncio.wait_for(store.claimed.wait(), timeout=10)
        duplicate = await client.post("/orders/o-1", json=body, headers=_key("p"))
        assert (await first).status_code == 201

    assert duplicate.status_code == 409 and _is_problem(duplicate)
    # How long the first has run (just started), never past its lease (tests/test_http_edges).
    assert 1 <= int(duplicate.headers["retry-after"]) <= REQUEST_TIMEOUT
    assert served.calls == {"orders:t1:p": 1}


async def test_route_matched_by_path_pattern_is_idempotent(
    client: httpx.AsyncClient, served: Served
) -> None:
    first = await client.post("/legacy", json={}, headers=_key("g"))
    replay = await client.post("/legacy", json={}, headers=_key("g"))

    assert first.status_code == replay.status_code == 201
    assert _replayed(replay) and replay.content == first.content
    assert served.calls == {"legacy": 1}


async def test_other_methods_and_unknown_routes_pass_through(client: httpx.AsyncClient) -> None:
    unknown = await client.post("/nowhere", json={})  # required key, but no route: 404
    not_allowed = await client.get("/orders/o-1")

    assert unknown.status_code == 404
    assert not_allowed.status_code == 405


# ---------------------------------------------------------------------- limits


async def _raw_chunked_post(port: int, path: str, total: int) -> tuple[bytes, int]:
    """POST ``total`` bytes chunked, stopping once the server answers; (answer, bytes sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: big\r\n"
        "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )
    answer = asyncio.create_task(reader.read(4096))
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        while sent < total and not answer.done():
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            drained = asyncio.ensure_future(writer.drain())
            await asyncio.wait({drained, answer}, return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():
                drained.cancel()
                break
            drained.result()
            sent += len(chunk)
        if not answer.done():
            writer.write(b"0\r\n\r\n")
        return await asyncio.wait_for(answer, 30), sent
    except ConnectionError:
        return await asyncio.wait_for(answer, 30), sent
    finally:
        writer.close()


async def test_aiohttp_stops_reading_a_chunked_body_at_the_limit() -> None:
    """A 100 MB chunked body under a 1 GiB client_max_size: 413 without buffering it."""
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).parent / "_big_body_server.py"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=checkout_env(),
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(await asyncio.wait_for(server.stdout.readline(), 30))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            small = await client.post("/upload", content=b"ok", headers=_key("small"))
            before = int((await client.get("/rss")).text)
            answer, _ = await _raw_chunked_post(port, "/upload", 100 << 20)
            after = int((await client.get("/rss")).text)
    finally:
        server.stdin.close()
        await asyncio.wait_for(server.wait(), 30)

    assert small.status_code == 200 and small.text == "2"
    assert answer.startswith(b"HTTP/1.1 413")
    # ru_maxrss is in KiB: reading the body whole would add over 100 MB.
    assert after - before < 20 * 1024, f"peak RSS grew by {(after - before) // 1024} MB"


async def test_store_failure_is_a_generic_503_and_the_details_go_to_the_log(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    internals = (
        "DynamoDB could not be reached at https://dynamodb.internal.example:8000 "
        "(table idem-orders-prod): check the endpoint and the VPC endpoint policy"
    )
    store = RecordingStore(
        MemoryStore(), fail_on={"claim": errors.StoreUnavailableError(internals)}
    )
    served = await start(store=store)
    with caplog.at_level(logging.ERROR, logger="idempotency_async"):
        async with _client(served) as client:
            response = await client.post("/orders/o-1", json={"sku": "A"}, headers=_key("x"))

    assert response.status_code == 503 and _is_problem(response)
    assert response.headers["retry-after"] == "1"
    for secret in ("dynamodb", "idem-orders", "endpoint", "8000", "VPC"):
        assert secret.lower() not in response.text.lower()
    assert set(response.json()) == {"type", "title", "status", "detail"}
    assert any(
        record.exc_info and "idem-orders-prod" in str(record.exc_info[1])
        for record in caplog.records
    )
    assert not served.calls


async def test_route_marker_without_the_middleware_fails_loudly() -> None:
    runs = 0

    def report(exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}"

    @web.middleware
    async def reporter(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.ConfigError as exc:
            return web.Response(status=500, text=report(exc))

    @idempotent_endpoint
    async def aiohttp_create(request: web.Request) -> web.Response:
        nonlocal runs
        runs += 1
        return web.Response(status=201)

    aio = web.Application(middlewares=[reporter])
    aio.router.add_post("/orders", aiohttp_create)
    api = FastAPI()
    api.add_exception_handler(
        errors.ConfigError, lambda request, exc: PlainTextResponse(report(exc), status_code=500)
    )

    @api.post("/orders", status_code=201)
    async def fastapi_create(key: IdempotencyKey) -> None:
        nonlocal runs
        runs += 1

    answers = []
    for serve in (serve_aio(aio), serve_asgi(api)):
        async with serve as base_url, httpx.AsyncClient(base_url=base_url) as client:
            answers.append(await client.post("/orders", json={}, headers=_key("k")))
    for answer in answers:
        assert answer.status_code == 500
        assert answer.text.startswith("ConfigError:") and "middleware" in answer.text
    assert runs == 0


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_json_body_nested_past_the_limit_is_400(
    client: httpx.AsyncClient, served: Served
) -> None:
    json_headers = {**_key("deep"), "content-type": "application/json"}
    # 2,000 levels fit the test apps' 4 KiB body limit and used to escape as RecursionError.
    far = await client.post("/legacy", content=_nested(2000), headers=json_headers)
    just_over = await client.post("/legacy", content=_nested(401), headers=json_headers)
    at_limit = await client.post("/legacy", content=_nested(400), headers=json_headers)

    for response in (far, just_over):
        assert response.status_code == 400 and _is_problem(response)
        assert "nested" in response.json()["title"] and "400" in response.json()["detail"]
    assert at_limit.status_code == 201
    assert served.calls == {"legacy": 1}


def test_ten_thousand_levels_are_a_400_not_a_recursion_error() -> None:
    rules = idempotency_middleware_rules(max_body_bytes=1 << 20)
    for body in (_nested(10_000), b'{"a":' * 10_000 + b"1" + b"}" * 10_000):
        with pytest.raises(Rejection) as rejected:
            _fingerprint(rules, body)
        assert rejected.value.response.status == 400
        assert b"at most 400 levels" in rejected.value.response.body


def test_body_depth_limit_is_validated() -> None:
    for bad in (0, 513, True, "400"):
        with pytest.raises(errors.ConfigError, match="max_body_depth"):
            idempotency_middleware(
                Manager(MemoryStore()), caller_scope=_tenant_of, max_body_depth=bad
            )
    idempotency_middleware(Manager(MemoryStore()), caller_scope=_tenant_of, max_body_depth=512)


def _tenant_of(request: Any) -> str:
    return "t"


def _fingerprint(
    rules: HttpIdempotency, body: bytes, *, query: str = "", content_type: str = "application/json"
) -> str:
    payload = rules.payload(
        method="POST",
        route="/",
        caller=None,
        key="k",
        path="/p",
        query=parse_qsl(query, keep_blank_values=True),
        content_type=content_type,
        body=body,
    )
    fingerprint: str = payload["fingerprint"]
    return fingerprint


def _fingerprint_cpu_seconds(rules: HttpIdempotency, body: bytes, *, query: str = "") -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        _fingerprint(rules, body, query=query)
        best = min(best, time.process_time() - started)
    return best


def test_fingerprints_stay_what_stored_records_hold() -> None:
    """Pinned values: a changed fingerprint turns every retry after an upgrade into a 422."""
    rules = idempotency_middleware_rules()
    body = b'{"b": 1.0, "a": [1e21, "\\u2028"]}'

    assert _fingerprint(rules, body, query="b=2&a=0&a=1") == "AI69dpirXyk0H9M0axUmyA=="
    # Sorted by name only: a repeated name keeps the order its values were sent in.
    assert _fingerprint(rules, body, query="b=2&a=1&a=0") == "V+FvNhMBxFVP0KMndhnDOw=="
    assert _fingerprint(rules, b"raw", content_type="text/plain") == "Ml8hEPVSG+TlzcDQp2NGqQ=="
    assert _fingerprint(rules, _nested(300), query="x=1") == "8FOaXN9B+fSbyUkDrxP6nQ=="


def _quarter_megabyte(depth: int) -> bytes:
    one = b"[" * depth + b"1" + b"]" * depth
    return b"[" + b",".join([one] * ((1 << 18) // (len(one) + 1))) + b"]"


def test_deep_bodies_never_reach_the_general_canonicalizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deep JSON is fingerprinted in slices, each on the fast path: the general path, about
    2.3x slower on 256 KB, is never handed any of it."""
    import idempotency_async.canonical._text as text

    def general(value: Any, *args: Any) -> bytes:
        raise AssertionError(f"the general path was handed {str(value)[:80]}...")

    rules = idempotency_middleware_rules(max_body_bytes=1 << 20)
    expected = _fingerprint(rules, _quarter_megabyte(399), query="page=2")
    monkeypatch.setattr(text, "general_bytes", general)
    # With a query string too, which used to send the whole fingerprint down the slow path.
    assert _fingerprint(rules, _quarter_megabyte(399), query="page=2") == expected
    assert _fingerprint(rules, _quarter_megabyte(20)) is not None


def test_fingerprint_cost_does_not_grow_with_nesting() -> None:
    """256 KB of 399-deep arrays cost about what 256 KB of 20-deep arrays do.

    A coarse guard against a blow-up with depth: the ratio is 1.2-1.9 on a loaded 2-core
    machine (best of 3, CPU time), so a tighter bound would fail by chance.  The slow path
    it once took is caught exactly by the test above."""
    rules = idempotency_middleware_rules(max_body_bytes=1 << 20)
    shallow = _fingerprint_cpu_seconds(rules, _quarter_megabyte(20))
    deep = _fingerprint_cpu_seconds(rules, _quarter_megabyte(399), query="page=2")

    assert deep < 3.5 * shallow, f"{deep:.3f} s deep vs {shallow:.3f} s shallow"


def idempotency_middleware_rules(**options: Any) -> HttpIdempotency:
    middleware = IdempotencyMiddleware(
        _no_app, manager=Manager(MemoryStore()), caller_scope=_tenant_of, **options
    )
    return middleware.rules


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


def _deep_value(rng: random.Random, depth: int) -> Any:
    """A chain ``depth`` containers deep, with scalars and small siblings that test key order."""
    scalars = [1, 1.5, 1e21, 132.0, -0.0, "x\u2028", None, True, 2**60]
    node: Any = rng.choice(scalars)
    for _ in range(depth):
        if rng.random() < 0.5:
            node = [rng.choice(scalars), node] if rng.random() < 0.5 else [node]
        else:
            keys = rng.sample(["b", "A", "a", "10", "2", "__proto__", "é", "Z"], 3)
            node = {keys[0]: node, keys[1]: rng.choice(scalars), keys[2]: {"k": [1, 2]}}
    return node


@pytest.mark.parametrize("depth", [127, 128, 129, 300, 510])
def test_sliced_fingerprint_equals_the_canonical_json(depth: int) -> None:
    for seed in range(5):
        expected = canonical_bytes(_deep_value(random.Random(seed), depth))
        assert _sliced(_deep_value(random.Random(seed), depth)) == expected


# ---------------------------------------------------------------------- FastAPI ergonomics


def _ergonomics_app(runs: list[str | None]) -> FastAPI:
    api = FastAPI()
    api.add_middleware(
        IdempotencyMiddleware, manager=Manager(MemoryStore()), paths=(), caller_scope=_tenant_of
    )

    @api.post("/required", status_code=201, openapi_extra=idempotency_openapi())
    async def required(order: dict[str, int], key: IdempotencyKey) -> None:
        runs.append(key)

    @api.post("/optional", status_code=201)
    async def optional(key: OptionalIdempotencyKey) -> None:
        runs.append(key)

    return api


async def test_fastapi_openapi_documents_the_header_and_its_answers() -> None:
    async with (
        serve_asgi(_ergonomics_app([])) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        schema = (await client.get("/openapi.json")).json()

    required = schema["paths"]["/required"]["post"]
    optional = schema["paths"]["/optional"]["post"]
    (req_param,) = [p for p in required["parameters"] if p["name"] == "Idempotency-Key"]
    (opt_param,) = [p for p in optional["parameters"] if p["name"] == "Idempotency-Key"]
    assert req_param["in"] == opt_param["in"] == "header"
    assert req_param["required"] is True and opt_param.get("required", False) is False
    assert "retry" in req_param["description"]
    for status in ("400", "409", "422"):
        assert "application/problem+json" in required["responses"][status]["content"]
    # Request validation's own 422 stays documented beside the middleware's.
    assert "application/json" in required["responses"]["422"]["content"]


async def test_fastapi_required_key_type_is_enforced_per_route() -> None:
    runs: list[str | None] = []
    async with (
        serve_asgi(_ergonomics_app(runs)) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        missing = await client.post("/required", json={"n": 1})
        keyed = await client.post("/required", json={"n": 1}, headers=_key('"q"'))
        optional = await client.post("/optional")

    assert missing.status_code == 400 and _is_problem(missing)
    assert "Idempotency-Key" in missing.json()["detail"]
    assert keyed.status_code == optional.status_code == 201
    assert runs == ["q", None]


def test_wait_options_match_the_manager_options() -> None:
    with pytest.raises(errors.ConfigError, match=r"wait takes a Wait, False .* got 5.0"):
        IdempotencyMiddleware(_no_app, manager=Manager(MemoryStore()), wait=5.0)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match=r"wait takes a Wait, False .* got True"):
        idempotency_middleware(Manager(MemoryStore()), wait=True)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match=r"Wait\(timeout=...\)"):
        idempotency_middleware(Manager(MemoryStore()), wait=Wait(timeout=0))
    rules = idempotency_middleware_rules(wait=Wait(timeout=2.5))
    assert rules.manager.options.wait == Wait(timeout=2.5)
    waiting = Manager(MemoryStore(), Options(wait=Wait(timeout=7.0)))
    inherited = IdempotencyMiddleware(_no_app, manager=waiting, caller_scope=_tenant_of).rules
    assert inherited.manager.options.wait == Wait(timeout=7.0)
    refusing = IdempotencyMiddleware(_no_app, manager=waiting, wait=False).rules
    assert refusing.manager.options.wait is None
