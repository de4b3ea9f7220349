"""Manager overhead, concurrency and memory, side by side with aws-lambda-powertools (sync).

    python benchmarks/bench_manager.py                # full run, ~3 min
    python benchmarks/bench_manager.py --only memory  # one part: overhead, concurrency, memory
    python benchmarks/bench_manager.py --smoke        # ~10 s, used by CI: fails when the memory
                                                      # of 10,000 calls in flight passes its pin

**Overhead** — one call at a time on an in-memory store, what a user's call runs, both
sides through their wrappers and with default options:

* ``execute``: ``await Manager(MemoryStore(), Options()).execute(order, lambda:
  process(order), timeout=10)``;
* ``decorator``: ``@idempotent_function(manager, payload="order", timeout=10)``;
* ``anchor``: aws-lambda-powertools ``@idempotent_function`` (its ``IdempotencyHandler``)
  on an equivalent in-memory layer (``_anchor.py``), with a Lambda context;
* ``by hand``: the idempotent call written by hand on the same MemoryStore
  (``_handwritten.py``), for reference;
* tuned: ``Options(local_cache=LocalCache())`` (a replay answered from the local cache).

Every call gets a fresh payload object (a replay: a fresh copy of the same order) and a
fresh callback.  A round runs a chunk of calls of every contender, in an order rotated each
round; ratios are taken within rounds and quoted as median (range), on CPU time
(``time.process_time``), with the wall-time median beside.

**Concurrency** — 2,000 distinct calls gathered on one loop, every store operation behind
5 ms of latency (``_handwritten.SlowStore``): per-call CPU of ``execute`` against the same
calls written by hand on the same store, with a timeout (``timeout=10``; by hand,
``asyncio.timeout``) and without; the harness alone (two 5 ms sleeps per call) for scale.

**Memory** — peak traced memory (``tracemalloc``) while 10,000 calls hold their keys at
once (``Options()``, no deadline; and ``timeout=10``), MemoryStore records included.
Traced memory does not depend on the machine's load, so ``--smoke`` checks it against a
pin and fails above it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _handwritten import Handwritten, SlowStore
from _stats import Clock, Timing, load, median_of, ratios, rotated_rounds

from idempotency_async import LocalCache, Manager, MemoryStore, Options, idempotent_function

TIMEOUT = 10.0
LATENCY = 0.005
IN_FLIGHT_CPU = 2000
IN_FLIGHT_MEMORY = 10_000
MEMORY_BUDGET_MIB = 26.0
"""The product's budget for 10,000 calls in flight."""
MEMORY_PIN_MIB = 26.0
"""What ``--smoke`` fails above: the measured peak (25.8 MiB, no deadline) plus a margin
(see BENCHMARKS.md), so a regression fails CI."""
MEMORY_PIN_TIMEOUT_MIB = 26.5
"""The same for calls with a timeout (measured 26.3 MiB: the deadline and the lease
length are floats of each call's own); checked by a full run, not ``--smoke``."""
FIRST_BUDGET = 0.5
REPLAY_BUDGET = 0.35
CONCURRENCY_BUDGET = 1.5


def order(n: int) -> dict[str, Any]:
    return {"id": f"ord-{n}", "amount": 10 + n % 90, "currency": "EUR", "customer": f"c-{n % 977}"}


async def process(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["id"], "status": "charged"}


# ------------------------------------------------------------------------------ overhead


class Overhead:
    """Chunks of first calls and replays for every contender."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.loop = asyncio.new_event_loop()
        self.numbers = iter(range(10**9))

    def payloads(self, replay: bool) -> list[dict[str, Any]]:
        if replay:
            return [order(0) for _ in range(self.calls)]  # fresh copies of one order
        return [order(next(self.numbers)) for _ in range(self.calls)]

    def ours(self, options: Options, *, replay: bool, decorated: bool = False) -> Timing:
        manager = Manager(MemoryStore(), options)
        payloads = self.payloads(replay)

        @idempotent_function(manager, payload="order", timeout=TIMEOUT)
        async def decorated_process(order: dict[str, Any]) -> dict[str, Any]:
            return {"order": order["id"], "status": "charged"}

        async def go() -> Timing:
            if replay:
                await manager.execute(order(0), lambda: process(order(0)), timeout=TIMEOUT)
                await decorated_process(order=order(0))
            if decorated:
                with Clock() as clock:
                    for payload in payloads:
                        await decorated_process(order=payload)
            else:
                with Clock() as clock:
                    for payload in payloads:
                        await manager.execute(
                            payload, lambda payload=payload: process(payload), timeout=TIMEOUT
                        )
            return clock.per_call(self.calls)

        return self.loop.run_until_complete(go())

    def by_hand(self, *, replay: bool) -> Timing:
        hand = Handwritten(MemoryStore(max_records=10**7))
        payloads = self.payloads(replay)

        async def go() -> Timing:
            if replay:
                await hand.call(order(0), lambda: process(order(0)), TIMEOUT)
            with Clock() as clock:
                for payload in payloads:
                    await hand.call(payload, lambda payload=payload: process(payload), TIMEOUT)
            return clock.per_call(self.calls)

        return self.loop.run_until_complete(go())

    def anchor(self, *, replay: bool) -> Timing:
        from _anchor import AnchorMemoryLayer, anchor_function

        call = anchor_function(AnchorMemoryLayer(), deadline_s=TIMEOUT)
        payloads = self.payloads(replay)
        if replay:
            call(order=order(0))
        with Clock() as clock:
            for payload in payloads:
                call(order=payload)
        return clock.per_call(self.calls)

    def close(self) -> None:
        self.loop.close()


def overhead(calls: int, rounds: int) -> None:
    bench = Overhead(calls)
    default, cached = Options(), Options(local_cache=LocalCache())
    for kind, replay in (("first call", False), ("replay", True)):
        runs: dict[str, Callable[[], Timing]] = {
            "execute": lambda replay=replay: bench.ours(default, replay=replay),
            "decorator": lambda replay=replay: bench.ours(default, replay=replay, decorated=True),
            "anchor": lambda replay=replay: bench.anchor(replay=replay),
            "by hand": lambda replay=replay: bench.by_hand(replay=replay),
        }
        if replay:
            runs["execute, local cache"] = lambda: bench.ours(cached, replay=True)
        for run in runs.values():
            run()  # warm-up: imports, logging, the anchor's Lambda-context machinery
        samples = rotated_rounds(runs, rounds)
        budget = FIRST_BUDGET if not replay else REPLAY_BUDGET
        print(f"  {kind} (µs per call: CPU, wall; ratios on CPU within rounds)")
        for name in runs:
            line = (
                f"    {name:<22}{median_of(samples[name]):7.2f}"
                f"{median_of(samples[name], 'wall'):8.2f}"
            )
            if name != "anchor":
                to_anchor = ratios(samples[name], samples["anchor"])
                line += f"   / anchor {to_anchor!s:<18}"
                if name != "by hand":
                    line += f"/ by hand {ratios(samples[name], samples['by hand'])!s:<18}"
                if name == "execute":
                    verdict = "met" if to_anchor.median <= budget else "MISSED"
                    line += f"budget <= {budget}x anchor: {verdict}"
            print(line)
    bench.close()


# ------------------------------------------------------------------------------ concurrency


def _in_flight(run: Callable[[Any], Any], make_store: Callable[[], Any], calls: int) -> Timing:
    """CPU and wall µs per call of ``calls`` calls gathered on a fresh loop."""

    async def go() -> Timing:
        call = run(make_store())  # one manager (or hand-written caller) for all the calls
        payloads = [order(n) for n in range(calls)]
        gc.collect()  # each run from a collected heap: a collection of the previous run's
        # garbage landing in a 30 ms window would swing it by 2x
        with Clock() as clock:
            await asyncio.gather(*(call(payload) for payload in payloads))
        return clock.per_call(calls)

    return asyncio.run(go())


def concurrency(rounds: int, calls: int) -> None:
    def execute(timeout: float | None) -> Callable[[Any], Any]:
        def start(store: Any) -> Any:
            manager = Manager(store, Options())
            return lambda p: manager.execute(p, lambda: process(p), timeout=timeout)

        return start

    def by_hand(timeout: float | None) -> Callable[[Any], Any]:
        def start(store: Any) -> Any:
            hand = Handwritten(store)
            return lambda p: hand.call(p, lambda: process(p), timeout)

        return start

    async def two_sleeps(_: Any) -> None:
        await asyncio.sleep(LATENCY)
        await asyncio.sleep(LATENCY)

    def slow() -> SlowStore:
        return SlowStore(LATENCY)

    runs: dict[str, Callable[[], Timing]] = {
        "execute, timeout=10": lambda: _in_flight(execute(TIMEOUT), slow, calls),
        "by hand, timeout": lambda: _in_flight(by_hand(TIMEOUT), slow, calls),
        "execute, no deadline": lambda: _in_flight(execute(None), slow, calls),
        "by hand, no timeout": lambda: _in_flight(by_hand(None), slow, calls),
        "harness alone": lambda: _in_flight(lambda _: two_sleeps, lambda: None, calls),
    }
    for run in runs.values():
        run()
    samples = rotated_rounds(runs, rounds)
    print(
        f"  {calls:,} calls in flight, {LATENCY * 1000:g} ms per store operation "
        "(µs per call: CPU, wall; calls/s)"
    )
    for name, sample in samples.items():
        wall = median_of(sample, "wall")
        print(f"    {name:<22}{median_of(sample):7.1f}{wall:8.1f}{1e6 / wall:>10,.0f}/s")
    for ours, floor in (
        ("execute, timeout=10", "by hand, timeout"),
        ("execute, no deadline", "by hand, no timeout"),
    ):
        spread = ratios(samples[ours], samples[floor])
        verdict = "met" if spread.median <= CONCURRENCY_BUDGET else "MISSED"
        print(
            f"    {ours} / {floor}: CPU {spread}, wall "
            f"{ratios(samples[ours], samples[floor], 'wall').median:.2f}"
            f"   budget <= {CONCURRENCY_BUDGET}x: {verdict}"
        )


# ------------------------------------------------------------------------------ memory


def peak_memory(
    in_flight: int, timeout: float | None, module: Any = None, ledger: bool = False
) -> float:
    """Peak traced MiB while ``in_flight`` calls hold their keys at once.

    ``module``: the package to measure (another commit's, see ``--baseline``).  With
    ``ledger``, print the bytes per call of each line that allocated them (the library's
    innermost line when the library is on the stack).
    """
    package = module or sys.modules["idempotency_async"]

    async def go() -> int:
        manager = package.Manager(package.MemoryStore(), package.Options())
        release = asyncio.Event()

        async def held(payload: dict[str, Any]) -> dict[str, Any]:
            await release.wait()
            return {"order": payload["id"]}

        payloads = [order(n) for n in range(in_flight)]
        gc.collect()
        tracemalloc.start(25 if ledger else 1)
        tasks = [
            asyncio.ensure_future(
                manager.execute(p, lambda p=p: held(p), timeout=timeout)  # type: ignore[misc]
            )
            for p in payloads
        ]
        await asyncio.sleep(0.05)
        _, peak = tracemalloc.get_traced_memory()
        snapshot = tracemalloc.take_snapshot() if ledger else None
        tracemalloc.stop()
        release.set()
        await asyncio.gather(*tasks)
        if snapshot is not None:
            _print_ledger(snapshot, package.__name__, in_flight)
        return peak

    return asyncio.run(go()) / 2**20


def _print_ledger(snapshot: tracemalloc.Snapshot, package: str, calls: int) -> None:
    where: dict[str, int] = {}
    for trace in snapshot.traces:
        frames = [f for f in trace.traceback if package in f.filename] or list(trace.traceback)
        frame = frames[-1]  # the innermost (tracebacks run from the oldest frame)
        name = frame.filename.split(f"{package}/")[-1].split("/")[-1]
        site = f"{name}:{frame.lineno}"
        where[site] = where.get(site, 0) + trace.size
    print("bytes per call in flight, by allocating line (the library's innermost line):")
    for site, size in sorted(where.items(), key=lambda item: -item[1]):
        if size / calls >= 8:
            print(f"  {size / calls:7.1f}  {site}")


def memory(smoke: bool, baseline: str | None = None) -> bool:
    ok = True
    # (A timeout long enough that a slow, traced run is never cut off: only its presence
    # changes what a call holds.)
    configurations = [
        ("no deadline", None, MEMORY_PIN_MIB),
        ("a timeout", 3600.0, MEMORY_PIN_TIMEOUT_MIB),
    ]
    for label, timeout, pin in configurations[:1] if smoke else configurations:
        # A fresh interpreter each: what earlier parts of the run left (grown tables,
        # caches) would otherwise move the peak by half a MiB.
        argv = [sys.executable, __file__, "--memory-child", str(timeout or 0)]
        if baseline:
            argv += ["--baseline", baseline]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        peak = float(done.stdout)
        per_call = peak * 2**20 / IN_FLIGHT_MEMORY
        verdict = "met" if peak <= MEMORY_BUDGET_MIB else "MISSED"
        print(
            f"  {baseline or 'now'}: {IN_FLIGHT_MEMORY:,} calls in flight, {label}: "
            f"peak {peak:.1f} MiB "
            f"({per_call:,.0f} B per call); budget <= {MEMORY_BUDGET_MIB:g} MiB: {verdict}"
            f"; pin {pin:g} MiB"
        )
        if peak > pin:
            print(f"  FAIL: {peak:.1f} MiB is above the pin ({pin:g} MiB)")
            ok = False
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks memory")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", choices=("overhead", "concurrency", "memory"), default=None)
    parser.add_argument(
        "--baseline", default=None, help="memory: measure this commit's package instead (git rev)"
    )
    parser.add_argument("--ledger", action="store_true", help="memory: bytes per call by line")
    parser.add_argument("--memory-child", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        logging.getLogger("idempotency_async").setLevel(logging.ERROR)
        logging.getLogger("idempotency_baseline").setLevel(logging.ERROR)
        module = None
        if args.baseline:
            from compare_baseline import export_baseline

            module = export_baseline(args.baseline, Path(tempfile.mkdtemp()))
        print(peak_memory(IN_FLIGHT_MEMORY, args.memory_child or None, module))
        return 0
    if args.ledger:
        logging.getLogger("idempotency_async").setLevel(logging.ERROR)
        print(f"python {sys.version.split()[0]}; traced memory of calls in flight")
        peak_memory(IN_FLIGHT_MEMORY, None, ledger=True)
        return 0
    # The library warns once per manager without a deadline, the anchor on every call
    # without a Lambda context: the cost stays, the noise goes.
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    rounds = args.rounds or (1 if args.smoke else 21)
    print(f"python {sys.version.split()[0]}; {load()}")
    started = time.perf_counter()
    if args.only in (None, "overhead"):
        calls = 50 if args.smoke else 300
        print(f"Overhead: {rounds} rounds of {calls} calls per contender, order rotated")
        overhead(calls, rounds)
    if args.only == "concurrency":
        print(f"Concurrency: {max(rounds // 2, 1)} rounds, order rotated")
        concurrency(max(rounds // 2, 1), 300 if args.smoke else IN_FLIGHT_CPU)
    elif args.only is None:
        # In a fresh interpreter that never loaded the anchor (aws-lambda-powertools and
        # what it imports): with thousands of tasks alive, full collections walk every
        # object of the process, and a heap grown by the overhead part would tax most the
        # side that allocates most.
        argv = [sys.executable, __file__, "--only", "concurrency", "--rounds", str(rounds)]
        if args.smoke:
            argv.append("--smoke")
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        print("\n".join(done.stdout.splitlines()[1:]))  # (its first line: the load)
    ok = True
    if args.only in (None, "memory"):
        print("Memory (traced, independent of load)")
        ok = memory(args.smoke, args.baseline)
    print(f"after: {load()}; {time.perf_counter() - started:.0f} s")
    if args.smoke:
        print("smoke run: timings not meaningful; memory checked against its pin")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
