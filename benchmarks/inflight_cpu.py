"""Per-call CPU with 2,000 calls in flight at 5 ms store latency, now against an earlier commit.

    python benchmarks/inflight_cpu.py 3d78990            # medians of 5 interleaved runs
    python benchmarks/inflight_cpu.py 3d78990 --rounds 3

Both versions (now, and an earlier commit exported as in ``compare_baseline.py``) run in one
process, interleaved.  CPU is ``time.process_time()``; "sequential" is one call at a time on
a plain MemoryStore, "in flight" 2,000 distinct calls gathered on one loop, each store
operation behind an ``asyncio.sleep(0.005)``; "by hand" is the same calls written by hand
on the same slow store (``_handwritten.py``: hashing, claim, ``asyncio.timeout``,
completion), the fair floor; "gc" the collector's share of the in-flight run
(``gc.callbacks``).  ``bench_manager.py`` measures the current version against that floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from _handwritten import Handwritten, SlowStore
from _stats import load, paired
from compare_baseline import export_baseline

import idempotency_async

LATENCY = 0.005
IN_FLIGHT = 2000
_gc = {"total": 0.0, "since": 0.0}


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc["since"] = time.process_time()
    else:
        _gc["total"] += time.process_time() - _gc["since"]


def slow_store(module: ModuleType) -> Any:
    inner = module.MemoryStore()

    class Slow:
        max_response_bytes = inner.max_response_bytes

        async def claim(self, claim: Any) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.claim(claim)

        async def get(self, key: str, *, now: float) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.get(key, now=now)

        async def complete(self, completion: Any) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.complete(completion)

        async def release(self, key: str, owner: str) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.release(key, owner)

        async def extend(self, claim: Any) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.extend(claim)

        async def force_release(self, key: str) -> Any:
            await asyncio.sleep(LATENCY)
            return await inner.force_release(key)

        async def aclose(self) -> None:
            await inner.aclose()

    return Slow()


async def _callback() -> dict[str, int]:
    return {"ok": 1}


def cpu_per_call(module: ModuleType, tag: str, *, in_flight: bool) -> float:
    async def go() -> float:
        store = slow_store(module) if in_flight else module.MemoryStore()
        manager = module.Manager(store, module.Options(key_prefix="b"))
        payloads = [{"id": f"{tag}-{n}", "amount": n} for n in range(IN_FLIGHT)]
        gc.collect()
        started = time.process_time()
        if in_flight:
            await asyncio.gather(*(manager.execute(p, _callback, timeout=10) for p in payloads))
        else:
            for payload in payloads:
                await manager.execute(payload, _callback, timeout=10)
        return (time.process_time() - started) / IN_FLIGHT * 1e6

    return asyncio.run(go())


def by_hand(tag: str) -> float:
    async def go() -> float:
        hand = Handwritten(SlowStore(LATENCY))
        payloads = [{"id": f"{tag}-{n}", "amount": n} for n in range(IN_FLIGHT)]
        gc.collect()
        started = time.process_time()
        await asyncio.gather(*(hand.call(p, _callback, 10) for p in payloads))
        return (time.process_time() - started) / IN_FLIGHT * 1e6

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit, e.g. 3d78990")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gc.callbacks.append(_on_gc)
    print(load())
    with tempfile.TemporaryDirectory() as folder:
        then = export_baseline(args.rev, Path(folder))
        runs: dict[str, list[float]] = {}
        for n in range(args.rounds):

            def now_in_flight(n: int = n) -> float:
                _gc["total"] = 0.0
                spent = cpu_per_call(idempotency_async, f"d{n}", in_flight=True)
                runs.setdefault("gc in now in flight", []).append(_gc["total"] / IN_FLIGHT * 1e6)
                return spent

            row: dict[str, Callable[[], float]] = {
                "by hand, in flight": lambda n=n: by_hand(f"e{n}"),
                f"{args.rev} sequential": lambda n=n: cpu_per_call(then, f"a{n}", in_flight=False),
                "now sequential": lambda n=n: cpu_per_call(
                    idempotency_async, f"b{n}", in_flight=False
                ),
                f"{args.rev} in flight": lambda n=n: cpu_per_call(then, f"c{n}", in_flight=True),
                "now in flight": now_in_flight,
            }
            names = list(row)
            for name in names[n % len(names) :] + names[: n % len(names)]:  # rotated
                runs.setdefault(name, []).append(row[name]())
    print(f"CPU µs per call, median of {args.rounds} (2,000 calls; in flight: 5 ms per store op)")
    for name, values in runs.items():
        print(f"  {name:<24} {statistics.median(values):6.1f}")
    for kind in ("sequential", "in flight"):
        now, earlier = runs[f"now {kind}"], runs[f"{args.rev} {kind}"]
        print(f"  now/{args.rev} {kind}, within rounds: {paired(now, earlier)}")
    hand = paired(runs["now in flight"], runs["by hand, in flight"])
    print(f"  now in flight / by hand, within rounds: {hand}")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
