"""Renewal at every door: one lease per call, the lease as renewed, read by ``execute``,
``Call.complete`` (its write bound), an in-process duplicate (``retry_after``) and the HTTP
gate (Starlette and aiohttp) — never a copy taken at the claim."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from _http_apps import serve_aio, serve_asgi
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support import RecordingStore, on_stores, record_of

from idempotency_async import Call, Manager, MemoryStore, Options, Renewal, errors
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Status
from idempotency_async.stores.base import Store
from idempotency_async.testing._vloop import VirtualClockLoop

RENEW = 1.0  # the short lease
EVERY = 0.25
SLOW = 0.4  # the store's completion answer: longer than the short lease's reserve (0.2 s)
WORK = 1.2  # past the first short lease


def _renewing(store: Any, **options: Any) -> Manager:
    return Manager(
        store, Options(key_prefix="doors", renewal=Renewal(lease=RENEW, every=EVERY), **options)
    )


def _slow_completion(store: Store) -> RecordingStore:
    recording = RecordingStore(store)
    recording.delay["complete"] = SLOW
    return recording


# -- Call.complete ----------------------------------------------------------------------


def _virtual(scenario: Callable[[VirtualClockLoop, Callable[[], float]], Awaitable[None]]) -> None:
    """Run ``scenario(loop, clock)`` on a virtual-time loop (MemoryStore only): exact times,
    no real waiting."""
    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(scenario(loop, lambda: 1_700_000_000.0 + loop.time()))
    finally:
        loop.close()


@on_stores("memory", "dynamodb")
async def test_call_complete_after_the_first_short_lease_is_bounded_by_the_renewed_lease(
    store: Store,
) -> None:
    # The completion write is bounded by the lease as renewed: past the first short lease,
    # a store answering in 0.4 s records the call (it was abandoned at the claim's lease
    # reserve, 0.2 s, leaving the key to be run again once the renewed lease lapsed).
    manager = _renewing(_slow_completion(store))
    runs = Counter[str]()

    async def work(call: Call) -> str:
        runs["work"] += 1
        await asyncio.sleep(WORK)
        await call.complete("done")
        return "done"

    assert await manager.execute_call({"id": 1}, work, timeout=30) == "done"
    key = manager.key_for({"id": 1})
    record = await record_of(store, key, now=manager.options.clock())
    assert record is not None and record.status is Status.COMPLETED
    # Another worker replays it: nothing runs twice.
    other = Manager(store, Options(key_prefix="doors"))
    assert await other.execute_call({"id": 1}, work, timeout=5) == "done"
    assert runs["work"] == 1


def test_call_complete_without_response_is_bounded_by_the_renewed_lease() -> None:
    store = MemoryStore()

    async def scenario(loop: VirtualClockLoop, clock: Callable[[], float]) -> None:
        manager = _renewing(_slow_completion(store), clock=clock)

        async def work(call: Call) -> str:
            await asyncio.sleep(WORK)
            await call.complete_without_response("streamed")
            return "streamed"

        assert await manager.execute_call({"id": 2}, work, timeout=30) == "streamed"
        record = await record_of(store, manager.key_for({"id": 2}), now=clock())
        assert record is not None and record.status is Status.COMPLETED
        assert record.not_stored == "streamed"

    _virtual(scenario)


# -- an in-process duplicate --------------------------------------------------------------


def test_an_in_process_duplicate_is_told_the_lease_as_renewed() -> None:
    async def scenario(loop: VirtualClockLoop, clock: Callable[[], float]) -> None:
        manager = _renewing(MemoryStore(), clock=clock)
        release = asyncio.Event()

        async def holds() -> str:
            await release.wait()
            return "held"

        holder = asyncio.create_task(manager.execute({"id": 3}, holds, timeout=30))
        # Renewed at 0.25, 0.5, ... 2.5 (lease to 3.5): the first short lease is long gone.
        await asyncio.sleep(2.6)
        with pytest.raises(errors.AlreadyInProgressError) as refused:
            await manager.execute({"id": 3}, holds, timeout=5)
        release.set()
        assert await holder == "held"
        # The lease as last renewed ends 0.9 s from now (read from the lease the claim
        # wrote, it had ended: 0).
        assert refused.value.retry_after == pytest.approx(0.9)
        assert refused.value.lease_end == pytest.approx(clock() + 0.9)

    _virtual(scenario)


# -- the HTTP gate ----------------------------------------------------------------------


def _starlette_app(manager: Manager, runs: Counter[str]) -> Starlette:
    async def order(request: Request) -> JSONResponse:
        runs["order"] += 1
        await asyncio.sleep(WORK)
        return JSONResponse({"run": runs["order"]}, status_code=201)

    app = Starlette(routes=[Route("/orders", order, methods=["POST"])])
    app.add_middleware(
        IdempotencyMiddleware,
        manager=manager,
        paths=["/orders"],
        caller_scope=lambda request: "tenant",
        request_timeout=30.0,
    )
    return app


def _aiohttp_app(manager: Manager, runs: Counter[str]) -> web.Application:
    @idempotent_endpoint
    async def order(request: web.Request) -> web.Response:
        runs["order"] += 1
        await asyncio.sleep(WORK)
        return web.json_response({"run": runs["order"]}, status=201)

    app = web.Application(
        middlewares=[
            idempotency_middleware(
                manager, caller_scope=lambda request: "tenant", request_timeout=30.0
            )
        ]
    )
    app.router.add_post("/orders", order)
    return app


@pytest.mark.parametrize("framework", ["starlette", "aiohttp"])
async def test_the_http_gate_records_a_slow_completion_under_renewal(framework: str) -> None:
    # The gate records through Call.complete and only logs a failure: bounded by the
    # claim's lease, the write was abandoned, and a retry with the same key re-ran the
    # endpoint once the renewed lease lapsed.
    store = MemoryStore()
    manager = _renewing(_slow_completion(store))
    runs = Counter[str]()
    if framework == "starlette":
        serving = serve_asgi(_starlette_app(manager, runs))
    else:
        serving = serve_aio(_aiohttp_app(manager, runs))
    async with serving as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        headers = {"Idempotency-Key": "order-1"}
        first = await client.post("/orders", json={"sku": "a"}, headers=headers)
        assert first.status_code == 201 and first.json() == {"run": 1}
        await asyncio.sleep(RENEW + 0.1)  # past any lease the call held
        retry = await client.post("/orders", json={"sku": "a"}, headers=headers)
    assert retry.status_code == 201 and retry.json() == {"run": 1}
    assert retry.headers.get("idempotent-replayed") == "true"
    assert runs["order"] == 1
