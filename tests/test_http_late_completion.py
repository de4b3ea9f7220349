"""A streamed response's body, once attached to its record, is final.

The gate completes a stream's record "not stored" before the head goes out, then attaches
the captured body.  When the first write's answer is lost and the request lands late —
after the attach — it must not take the body back (the crossing simulator's seed 274):
duplicates that replayed the body and later ones would get different answers (G6).

Through uvicorn + FastAPI and aiohttp on loopback, on real stores; the fault is a
wrapper around the store that delays the first completion past the attach.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from idempotency_async import Manager, errors
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Completion
from idempotency_async.stores.base import Store, Written

CHUNKS = (b"first,", b"second,", b"third")
OPTIONS: dict[str, Any] = {"paths": (), "required": True, "request_timeout": 5.0}


class _FirstCompletionLandsLate:
    """The store, but the first completion without a response gets no answer: the client
    sees an error, and the request lands — is applied — right after the next completion
    (the body's attach), as a resend delayed on the way would."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.late: Completion | None = None
        self.landed: list[Written] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, completion: Completion) -> Written:
        if completion.encoded is None and self.late is None:
            self.late = completion
            raise errors.StoreUnavailableError("the completion's answer was lost (injected)")
        written = await self.inner.complete(completion)
        if self.late is not None and not self.landed:
            self.landed.append(await self.inner.complete(self.late))
        return written


async def _chunks() -> AsyncIterator[bytes]:
    for chunk in CHUNKS:
        yield chunk


def _fastapi(store: Any, runs: Counter[str]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, manager=Manager(store), **OPTIONS)

    @app.post("/stream")
    async def stream(key: IdempotencyKey) -> Any:
        runs[key] += 1
        return StreamingResponse(_chunks(), media_type="text/plain")

    return app


def _aiohttp(store: Any, runs: Counter[str]) -> web.Application:
    app = web.Application(middlewares=[idempotency_middleware(Manager(store), **OPTIONS)])

    @idempotent_endpoint
    async def stream(request: web.Request) -> web.StreamResponse:
        runs[request.headers["Idempotency-Key"]] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        async for chunk in _chunks():
            await response.write(chunk)
        return response

    app.router.add_post("/stream", stream)
    return app


# Each store's own rule is the conformance kit's; here the gate meets it end to end.
@pytest.mark.parametrize(
    ("framework", "store"),
    [
        ("fastapi", "memory"),
        ("aiohttp", "memory"),
        ("fastapi", "dynamodb"),
        ("aiohttp", "redis"),
        ("fastapi", "postgres"),
    ],
    indirect=["store"],
)
async def test_a_late_first_completion_never_takes_the_attached_body_back(
    store: Store, framework: str
) -> None:
    late = _FirstCompletionLandsLate(store)
    runs: Counter[str] = Counter()
    serve = (
        serve_asgi(_fastapi(late, runs))
        if framework == "fastapi"
        else serve_aio(_aiohttp(late, runs))
    )
    headers = {"Idempotency-Key": "late-head"}
    async with serve as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        first = await client.post("/stream", headers=headers)
        retry = await client.post("/stream", headers=headers)

    assert first.status_code == 200 and first.content == b"".join(CHUNKS)
    assert late.late is not None, "no completion without a response was sent: proves nothing"
    assert runs["late-head"] == 1
    assert retry.status_code == 200 and retry.headers.get("idempotent-replayed") == "true"
    assert "idempotency-response-stored" not in retry.headers, retry.headers
    assert retry.content == b"".join(CHUNKS)
    # The late write met the owner's record with the body: kept, and told so.
    assert late.landed == [Written.RESPONSE]
