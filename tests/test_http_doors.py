"""Responses the middleware does not produce itself, through real servers on loopback.

Files the server sends on its own (aiohttp's ``FileResponse``, ASGI ``pathsend``),
bodies compressed inside the middleware (Starlette's ``GZipMiddleware``, an aiohttp
handler's pre-compressed body, aiohttp's own compression), and query strings whose
values hold percent escapes.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from idempotency_async import Manager, MemoryStore
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.starlette import IdempotencyMiddleware

CALLER = "the-caller"
REPORT = b"".join(b"line %05d of the report\n" % n for n in range(4000))  # ~100 KB


def _key(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


def _not_stored(response: httpx.Response) -> bool:
    return (
        response.headers.get("idempotency-response-stored") == "false"
        and response.headers["content-type"] == "application/problem+json"
    )


# ---------------------------------------------------------------------- files


def _file_app(calls: Counter[str], directory: Path) -> web.Application:
    app = web.Application(
        middlewares=[
            idempotency_middleware(
                Manager(MemoryStore()), paths=(), caller_scope=lambda request: CALLER
            )
        ]
    )

    @idempotent_endpoint
    async def export(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        calls[name] += 1
        calls[f"peer:{request.transport.get_extra_info('peername')[1]}"] += 1  # type: ignore[union-attr]
        return web.FileResponse(directory / name)

    async def peer(request: web.Request) -> web.Response:
        return web.json_response({"port": request.transport.get_extra_info("peername")[1]})  # type: ignore[union-attr]

    app.router.add_post("/exports/{name}", export)
    app.router.add_get("/peer", peer)
    return app


async def test_aiohttp_file_response_is_sent_once_on_a_kept_connection_and_never_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "report.txt").write_bytes(REPORT)
    calls: Counter[str] = Counter()
    caplog.set_level(logging.ERROR, logger="aiohttp")
    # One connection for every request: a response that breaks it fails the next one.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with (
        serve_aio(_file_app(calls, tmp_path)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10, limits=limits) as client,
    ):
        first = await client.post("/exports/report.txt", headers=_key("f1"))
        peer = await client.get("/peer")  # the next request on the kept-alive connection
        retry = await client.post("/exports/report.txt", headers=_key("f1"))
        missing = await client.post("/exports/gone.txt", headers=_key("f2"))
        missing_again = await client.post("/exports/gone.txt", headers=_key("f2"))

    assert first.status_code == 200 and first.content == REPORT
    assert first.headers["idempotency-response-stored"] == "false"  # said on the live head
    assert peer.status_code == 200
    assert [name for name in calls if name.startswith("peer:")] == [f"peer:{peer.json()['port']}"]
    assert not [r for r in caplog.records if "Unhandled exception" in r.getMessage()]
    # The file went out, and the handler does not run again for its retry.
    assert calls["report.txt"] == 1
    assert retry.status_code == 200 and _not_stored(retry), retry.text
    assert "sent from a file" in retry.json()["detail"]
    assert "Content-Length" not in retry.json()["detail"]
    # A FileResponse with no file to send answers with no body: recorded as it is.
    assert missing.status_code == 404 and calls["gone.txt"] == 1
    assert missing_again.status_code == 404 and _replayed(missing_again)


class _PathsendServer:
    """Between uvicorn and the app: a server offering the ``http.response.pathsend``
    extension (uvicorn does not), sending the named file itself as such a server does."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent_by_path: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extensions = {**(scope.get("extensions") or {}), "http.response.pathsend": {}}
        scope = {**scope, "extensions": extensions}

        async def server_send(message: Any) -> None:
            if message["type"] == "http.response.pathsend":
                self.sent_by_path.append(message["path"])
                body = await asyncio.to_thread(Path(message["path"]).read_bytes)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        await self.app(scope, receive, server_send)


async def test_asgi_pathsend_is_delivered_and_its_retry_says_it_was_sent_from_a_file(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.txt"
    report.write_bytes(REPORT)
    runs: list[int] = []

    async def export(request: Request) -> Response:
        runs.append(1)
        return FileResponse(report)

    app = Starlette(
        routes=[Route("/export", export, methods=["POST"])],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                caller_scope=lambda request: CALLER,
            )
        ],
    )
    server = _PathsendServer(app)
    async with (
        serve_asgi(server) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        first = await client.post("/export", headers=_key("p1"))
        retry = await client.post("/export", headers=_key("p1"))

    assert server.sent_by_path == [str(report)]
    assert first.status_code == 200 and first.content == REPORT
    assert first.headers["idempotency-response-stored"] == "false"
    assert runs == [1]
    assert retry.status_code == 200 and _not_stored(retry), retry.text
    assert "sent from a file" in retry.json()["detail"]
    assert "stopped before its end" not in retry.json()["detail"]


# ---------------------------------------------------------------------- compression

ORDER = {"order_id": "o-1", "items": [{"sku": f"SKU-{n}", "qty": n} for n in range(200)]}


def _gzip_starlette(runs: list[str]) -> Starlette:
    async def create(request: Request) -> Response:
        runs.append("plain")
        return JSONResponse(ORDER, status_code=201)

    async def stream(request: Request) -> Response:
        runs.append("stream")

        async def parts() -> Any:
            for item in ORDER["items"]:  # type: ignore[attr-defined]
                yield orjson.dumps(item) + b"\n"

        return StreamingResponse(parts(), media_type="application/x-ndjson")

    return Starlette(
        routes=[
            Route("/orders", create, methods=["POST"]),
            Route("/stream", stream, methods=["POST"]),
        ],
        # The first is the outermost: the idempotency middleware sees compressed bodies.
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                caller_scope=lambda request: CALLER,
            ),
            Middleware(GZipMiddleware, minimum_size=0),
        ],
    )


async def test_a_body_compressed_inside_the_middleware_replays_with_its_encoding() -> None:
    runs: list[str] = []
    async with (
        serve_asgi(_gzip_starlette(runs)) as base_url,
        httpx.AsyncClient(
            base_url=base_url, timeout=10, headers={"Accept-Encoding": "gzip"}
        ) as client,
    ):
        first = await client.post("/orders", headers=_key("z1"))
        again = await client.post("/orders", headers=_key("z1"))
        streamed = await client.post("/stream", headers=_key("z2"))
        streamed_again = await client.post("/stream", headers=_key("z2"))

    assert runs == ["plain", "stream"]
    assert first.headers["content-encoding"] == "gzip"  # GZip did run inside
    assert again.status_code == 201 and _replayed(again)
    # httpx decodes by Content-Encoding: without it the JSON would be gzip bytes.
    assert again.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in again.headers["vary"].lower()
    assert again.json() == first.json() == ORDER
    assert streamed_again.status_code == 200 and _replayed(streamed_again)
    assert streamed_again.headers["content-encoding"] == "gzip"
    assert streamed_again.content == streamed.content
    assert streamed.content.count(b"\n") == len(ORDER["items"])  # type: ignore[arg-type]


def _compressing_aiohttp(runs: list[str]) -> web.Application:
    app = web.Application(
        middlewares=[
            idempotency_middleware(
                Manager(MemoryStore()), paths=(), caller_scope=lambda request: CALLER
            )
        ]
    )

    @idempotent_endpoint
    async def precompressed(request: web.Request) -> web.Response:
        runs.append("precompressed")
        return web.Response(
            body=gzip.compress(orjson.dumps(ORDER)),
            status=201,
            headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
            content_type="application/json",
        )

    @idempotent_endpoint
    async def compressed_stream(request: web.Request) -> web.StreamResponse:
        runs.append("stream")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.enable_compression()  # aiohttp codes the body below the middleware's capture
        await response.prepare(request)
        for item in ORDER["items"]:  # type: ignore[attr-defined]
            await response.write(orjson.dumps(item) + b"\n")
        return response

    app.router.add_post("/precompressed", precompressed)
    app.router.add_post("/stream", compressed_stream)
    return app


async def test_aiohttp_compressed_bodies_replay_readable() -> None:
    runs: list[str] = []
    async with (
        serve_aio(_compressing_aiohttp(runs)) as base_url,
        httpx.AsyncClient(
            base_url=base_url, timeout=10, headers={"Accept-Encoding": "gzip"}
        ) as client,
    ):
        first = await client.post("/precompressed", headers=_key("a1"))
        again = await client.post("/precompressed", headers=_key("a1"))
        streamed = await client.post("/stream", headers=_key("a2"))
        streamed_again = await client.post("/stream", headers=_key("a2"))

    assert runs == ["precompressed", "stream"]
    assert again.status_code == 201 and _replayed(again)
    assert again.headers["content-encoding"] == "gzip"
    assert again.json() == first.json() == ORDER
    assert streamed.headers["content-encoding"] == "gzip"
    # aiohttp compressed below the capture: the record holds the body before its coding.
    assert _replayed(streamed_again) and "content-encoding" not in streamed_again.headers
    assert streamed_again.content == streamed.content


# ---------------------------------------------------------------------- query strings


def _echo_query_apps(seen: list[str]) -> dict[str, Any]:
    async def starlette_echo(request: Request) -> Response:
        seen.append(request.query_params["x"])
        return JSONResponse({"x": request.query_params["x"]}, status_code=201)

    starlette_app = Starlette(
        routes=[Route("/echo", starlette_echo, methods=["POST"])],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                manager=Manager(MemoryStore()),
                caller_scope=lambda request: CALLER,
            )
        ],
    )

    async def aiohttp_echo(request: web.Request) -> web.Response:
        seen.append(request.query["x"])
        return web.json_response({"x": request.query["x"]}, status=201)

    aiohttp_app = web.Application(
        middlewares=[
            idempotency_middleware(Manager(MemoryStore()), caller_scope=lambda request: CALLER)
        ]
    )
    aiohttp_app.router.add_post("/echo", aiohttp_echo)
    return {"starlette": (serve_asgi, starlette_app), "aiohttp": (serve_aio, aiohttp_app)}


@pytest.mark.parametrize("framework", ["starlette", "aiohttp"])
async def test_query_values_are_fingerprinted_as_the_application_decodes_them(
    framework: str,
) -> None:
    seen: list[str] = []
    serve, app = _echo_query_apps(seen)[framework]
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        escaped = await client.post("/echo?x=%2541", headers=_key("q1"))
        plain = await client.post("/echo?x=A", headers=_key("q1"))
        again = await client.post("/echo?x=%2541", headers=_key("q1"))
        plus = await client.post("/echo?x=a%2Bb", headers=_key("q2"))
        space = await client.post("/echo?x=a+b", headers=_key("q2"))

    assert escaped.json() == {"x": "%41"}  # the handler read the value decoded once
    assert plain.status_code == 422, plain.text  # another request under the same key
    assert again.status_code == 201 and _replayed(again)
    assert plus.json() == {"x": "a+b"}
    assert space.status_code == 422, space.text  # "a b" to the handler
    assert seen == ["%41", "a+b"]
