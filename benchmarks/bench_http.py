"""One request through the Starlette middleware, in process (httpx's ASGITransport).

Run ``python benchmarks/bench_http.py`` (``--smoke`` for a few seconds, ``--json`` for one
line of numbers another script can compare, e.g. across two checkouts run alternately).
Rows, in µs per request of CPU (process time: steadier than wall time on a shared machine)
and wall time, medians of rounds whose order rotates; the middleware's rows also as a
ratio to the bare app within each round (median and range):

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
from collections.abc import Callable

import httpx
from _stats import Clock, Timing, load, median_of, ratios, rotated_rounds
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
) -> Callable[[], Timing]:
    async def batch() -> Timing:
        with Clock() as clock:
            for _ in range(n):
                response = await client.post(
                    "/orders", json=BODY, headers={"idempotency-key": keys()}
                )
                if response.status_code != 201:
                    raise RuntimeError(f"unexpected answer {response.status_code}: {response.text}")
        return clock.per_call(n)

    def run() -> Timing:
        return loop.run_until_complete(batch())

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description="one request through the Starlette middleware")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.smoke else 21)
    n = 50 if args.smoke else 200
    loop = asyncio.new_event_loop()
    counter = itertools.count()
    clients = {
        name: httpx.AsyncClient(
            transport=httpx.ASGITransport(app=_app(name != "bare")), base_url="http://test"
        )
        for name in ("bare", "first call", "replay")
    }
    runs: dict[str, Callable[[], Timing]] = {
        "bare": _timer(loop, clients["bare"], lambda: "k", n),
        "first call": _timer(loop, clients["first call"], lambda: f"k-{next(counter)}", n),
        "replay": _timer(loop, clients["replay"], lambda: "the-same-key", n),
    }
    for run in runs.values():
        run()  # warm up: imports, the replayed key's record
    samples = rotated_rounds(runs, repeats)

    async def close() -> None:
        for client in clients.values():
            await client.aclose()

    loop.run_until_complete(close())
    loop.close()
    if args.json:
        print(json.dumps({name: median_of(sample) for name, sample in samples.items()}))
        return
    print(f"{load()}; {repeats} rounds of {n} requests, order rotated")
    for name, sample in samples.items():
        line = (
            f"{name:<12} CPU {median_of(sample):8.1f} µs, wall {median_of(sample, 'wall'):8.1f} µs"
        )
        if name != "bare":
            line += f"   / bare, CPU within rounds {ratios(sample, samples['bare'])}"
        print(line)


if __name__ == "__main__":
    main()
