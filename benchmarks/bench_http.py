"""One request through the Starlette middleware, in process (httpx's ASGITransport).

Run ``python benchmarks/bench_http.py`` (``--smoke`` for a few seconds, ``--json`` for one
line of numbers another script can compare, e.g. across two checkouts run alternately).
Rows, in µs of CPU per request (process time: steadier than wall time on a shared
machine), the median of interleaved repeats:

* bare: the app without the middleware (what httpx and Starlette cost on their own);
* first call: a new Idempotency-Key each request (claim, run, complete with the response);
* replay: the same key again (claim finds the record, the stored response is sent).

A small JSON body, a JSON response, a ``MemoryStore``: the middleware's own work, not the
store's.  The machine is small and noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Callable

import httpx
from _stats import interleaved
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_async import Manager, MemoryStore
from idempotency_async.integrations.starlette import IdempotencyMiddleware

BODY = {"amount": 1200, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}]}


async def create_order(request: Request) -> JSONResponse:
    order = await request.json()
    return JSONResponse({"id": "o-1", "amount": order["amount"]}, status_code=201)


def _app(idempotent: bool) -> Starlette:
    middleware = [
        Middleware(
            IdempotencyMiddleware,
            manager=Manager(MemoryStore(max_records=1_000_000)),
            caller_scope=lambda request: "tenant",
        )
    ]
    return Starlette(
        routes=[Route("/orders", create_order, methods=["POST"])],
        middleware=middleware if idempotent else [],
    )


def _timer(
    loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient, keys: Callable[[], str], n: int
) -> Callable[[], float]:
    async def batch() -> float:
        start = time.process_time()
        for _ in range(n):
            response = await client.post("/orders", json=BODY, headers={"idempotency-key": keys()})
            if response.status_code != 201:
                raise RuntimeError(f"unexpected answer {response.status_code}: {response.text}")
        return (time.process_time() - start) / n * 1e6

    def run() -> float:
        return loop.run_until_complete(batch())

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description="one request through the Starlette middleware")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.smoke else 9)
    n = 50 if args.smoke else 400
    loop = asyncio.new_event_loop()
    counter = itertools.count()
    clients = {
        name: httpx.AsyncClient(
            transport=httpx.ASGITransport(app=_app(name != "bare")), base_url="http://test"
        )
        for name in ("bare", "first call", "replay")
    }
    runs: dict[str, Callable[[], float]] = {
        "bare": _timer(loop, clients["bare"], lambda: "k", n),
        "first call": _timer(loop, clients["first call"], lambda: f"k-{next(counter)}", n),
        "replay": _timer(loop, clients["replay"], lambda: "the-same-key", n),
    }
    for run in runs.values():
        run()  # warm up: imports, the replayed key's record
    medians = interleaved(runs, repeats)

    async def close() -> None:
        for client in clients.values():
            await client.aclose()

    loop.run_until_complete(close())
    loop.close()
    if args.json:
        print(json.dumps(medians))
        return
    for name, value in medians.items():
        print(f"{name:<12} {value:8.1f} µs/request")


if __name__ == "__main__":
    main()
