"""Manager overhead and concurrency, side by side with aws-lambda-powertools (sync).

    python benchmarks/bench_manager.py            # full run (about a minute)
    python benchmarks/bench_manager.py --smoke    # a few seconds, for CI

Reports medians of interleaved repeats and ratios; see BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _anchor import AnchorMemoryLayer, anchor_function
from _stats import interleaved, parse_args

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Verdict, Written

LATENCY = 0.005
TIMEOUT = 10.0  # every call has a deadline, as the anchor's do through its Lambda context


class SlowStore:
    """MemoryStore behind a 5 ms round trip per operation."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.max_response_bytes = self.inner.max_response_bytes

    async def claim(self, claim: Claim) -> Verdict:
        await asyncio.sleep(LATENCY)
        return await self.inner.claim(claim)

    async def get(self, key: str, *, now: float) -> Verdict:
        await asyncio.sleep(LATENCY)
        return await self.inner.get(key, now=now)

    async def complete(self, completion: Completion) -> Written:
        await asyncio.sleep(LATENCY)
        return await self.inner.complete(completion)

    async def release(self, key: str, owner: str) -> bool:
        await asyncio.sleep(LATENCY)
        return await self.inner.release(key, owner)

    async def extend(self, claim: Claim) -> bool:
        await asyncio.sleep(LATENCY)
        return await self.inner.extend(claim)

    async def force_release(self, key: str) -> Record | None:
        await asyncio.sleep(LATENCY)
        return await self.inner.force_release(key)

    async def aclose(self) -> None:
        await self.inner.aclose()


def order(n: int) -> dict[str, Any]:
    return {"id": f"ord-{n}", "amount": 10 + n % 90, "currency": "EUR", "customer": f"c-{n % 977}"}


async def _result(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["id"], "status": "charged"}


def per_call_overhead(calls: int, *, deadline: bool) -> dict[str, float]:
    """µs per call: first calls (distinct keys) and replays, ours vs anchor.

    With ``deadline`` both sides bound each call (ours ``timeout=``, the anchor a Lambda
    context), as in production; without, ours uses a fixed lease and the anchor has no
    context (its per-call "no remaining time" warning is silenced, not avoided).
    """
    loop = asyncio.new_event_loop()
    timeout = TIMEOUT if deadline else None
    anchor_deadline = TIMEOUT if deadline else None
    counter = iter(range(10**9))

    def ours_first() -> float:
        manager = Manager(MemoryStore(), Options(key_prefix="bench", lease=60))
        payloads = [order(next(counter)) for _ in range(calls)]

        async def go() -> None:
            for payload in payloads:
                callback = functools.partial(_result, payload)
                await manager.execute(payload, callback, timeout=timeout)

        start = time.perf_counter()
        loop.run_until_complete(go())
        return (time.perf_counter() - start) / calls * 1e6

    def ours_replay() -> float:
        manager = Manager(MemoryStore(), Options(key_prefix="bench", lease=60))
        payload = order(0)

        async def go() -> None:
            await manager.execute(payload, lambda: _result(payload), timeout=timeout)
            start = time.perf_counter()
            for _ in range(calls):
                await manager.execute(payload, lambda: _result(payload), timeout=timeout)
            timing.append(time.perf_counter() - start)

        timing: list[float] = []
        loop.run_until_complete(go())
        return timing[0] / calls * 1e6

    def anchor_first() -> float:
        process = anchor_function(AnchorMemoryLayer(), deadline_s=anchor_deadline)
        payloads = [order(next(counter)) for _ in range(calls)]
        start = time.perf_counter()
        for payload in payloads:
            process(order=payload)
        return (time.perf_counter() - start) / calls * 1e6

    def anchor_replay() -> float:
        process = anchor_function(AnchorMemoryLayer(), deadline_s=anchor_deadline)
        payload = order(0)
        process(order=payload)
        start = time.perf_counter()
        for _ in range(calls):
            process(order=payload)
        return (time.perf_counter() - start) / calls * 1e6

    # Warm the logging/Lambda-context machinery of both before timing.
    ours_first(), anchor_first()
    medians = interleaved(
        {
            "ours first": ours_first,
            "anchor first": anchor_first,
            "ours replay": ours_replay,
            "anchor replay": anchor_replay,
        },
        repeats=REPEATS,
    )
    loop.close()
    return medians


def concurrency(calls: int) -> dict[str, float]:
    """calls/s for ``calls`` distinct keys, every store operation taking 5 ms."""

    def floor() -> float:
        async def one() -> None:
            await asyncio.sleep(LATENCY)
            await asyncio.sleep(LATENCY)

        async def go() -> float:
            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(calls)))
            return calls / (time.perf_counter() - start)

        return asyncio.run(go())

    def ours() -> float:
        async def go() -> float:
            manager = Manager(SlowStore(), Options(key_prefix="bench", lease=60))
            payloads = [order(n) for n in range(calls)]
            start = time.perf_counter()
            await asyncio.gather(
                *(
                    manager.execute(p, functools.partial(_result, p), timeout=TIMEOUT)
                    for p in payloads
                )
            )
            return calls / (time.perf_counter() - start)

        return asyncio.run(go())

    def anchor() -> float:
        process = anchor_function(AnchorMemoryLayer(latency=LATENCY))
        payloads = [order(n) for n in range(calls)]
        with ThreadPoolExecutor(max_workers=32) as pool:
            start = time.perf_counter()
            list(pool.map(lambda p: process(order=p), payloads))
            return calls / (time.perf_counter() - start)

    def clean(run: Callable[[], float]) -> Callable[[], float]:
        # Each run starts from a collected heap: otherwise whether a full collection of
        # the previous run's garbage lands inside a 30 ms window swings results by 2x.
        def measured() -> float:
            gc.collect()
            return run()

        return measured

    runs = {"floor": clean(floor), "ours": clean(ours), "anchor": clean(anchor)}
    return interleaved(runs, repeats=max(REPEATS, 3) * 2 if REPEATS > 1 else 1)


def peak_memory(in_flight: int) -> float:
    """Peak traced MiB while ``in_flight`` calls hold their keys at once."""

    async def go() -> int:
        manager = Manager(MemoryStore(), Options(key_prefix="bench", lease=60))
        release = asyncio.Event()

        async def held(payload: dict[str, Any]) -> dict[str, Any]:
            await release.wait()
            return {"order": payload["id"]}

        payloads = [order(n) for n in range(in_flight)]
        gc.collect()
        tracemalloc.start()
        tasks = [
            asyncio.ensure_future(manager.execute(p, lambda p=p: held(p)))  # type: ignore[misc]
            for p in payloads
        ]
        await asyncio.sleep(0.05)
        _, peak = tracemalloc.get_traced_memory()
        release.set()
        await asyncio.gather(*tasks)
        tracemalloc.stop()
        return peak

    return asyncio.run(go()) / 2**20


def main() -> None:
    global REPEATS
    args = parse_args(__doc__ or "")
    REPEATS = args.repeats or (1 if args.smoke else 7)
    calls = 200 if args.smoke else 3000
    import logging

    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    # Without a Lambda context the anchor warns on every call; the cost stays, the noise goes.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    print(f"Per-call overhead, µs (median of {REPEATS} interleaved repeats, {calls} calls each)")
    for deadline in (True, False):
        overhead = per_call_overhead(calls, deadline=deadline)
        print("  with a deadline on every call" if deadline else "  without deadlines")
        for kind in ("first", "replay"):
            ours, anchor = overhead[f"ours {kind}"], overhead[f"anchor {kind}"]
            ratio = ours / anchor
            print(f"    {kind:<7} ours {ours:7.2f}   anchor {anchor:7.2f}   ratio {ratio:.2f}")
    conc_calls = 300 if args.smoke else 2000
    rates = concurrency(conc_calls)
    print(f"Concurrency, {conc_calls} distinct calls, 5 ms per store operation (calls/s, median)")
    print(
        f"  floor {rates['floor']:9.0f}   ours {rates['ours']:9.0f}   anchor(32 threads) "
        f"{rates['anchor']:9.0f}"
    )
    print(
        f"  ours/floor {rates['ours'] / rates['floor']:5.2f}   "
        f"ours/anchor {rates['ours'] / rates['anchor']:5.2f}"
    )
    in_flight = 1000 if args.smoke else 10_000
    print(f"Peak traced memory, {in_flight} in-flight calls: {peak_memory(in_flight):.1f} MiB")


REPEATS = 7

if __name__ == "__main__":
    main()
