"""What OpenTelemetry costs per call, and what the hooks cost when it is not configured.

    python benchmarks/bench_otel.py                       # in-process comparison, ~30 s
    python benchmarks/bench_otel.py --smoke               # a few seconds, for CI
    python benchmarks/bench_otel.py --baseline /tmp/base  # this tree vs another checkout

The in-process run times first calls and replays (MemoryStore, a deadline on every call) for
a manager without telemetry, with ``Telemetry()`` while the API's global providers are the
no-op ones, and with SDK providers that record everything (no exporter).  ``--baseline``
runs ``per_call_overhead`` of each tree's own ``bench_manager.py`` in alternating
subprocesses (so each imports its own package) and compares the medians; see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _stats import interleaved

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.otel import Telemetry

TIMEOUT = 10.0
# CPU time of this process: on a shared, loaded machine wall time swings by tens of percent.
_clock = time.process_time
HERE = Path(__file__).resolve().parent.parent


def order(n: int) -> dict[str, Any]:
    return {"id": f"ord-{n}", "amount": 10 + n % 90, "currency": "EUR", "customer": f"c-{n % 977}"}


async def _result(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["id"], "status": "charged"}


def _sdk_telemetry() -> Telemetry:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    # Spans are recorded and ended; with no processor nothing is exported.
    return Telemetry(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
    )


def per_call(calls: int, repeats: int) -> dict[str, float]:
    """µs per call for each configuration (medians of interleaved repeats)."""
    loop = asyncio.new_event_loop()
    counter = iter(range(10**9))
    configurations: dict[str, Callable[[], Telemetry | None]] = {
        "plain": lambda: None,
        "otel no-op": Telemetry,
        "otel sdk": _sdk_telemetry,
    }

    def first(make: Callable[[], Telemetry | None]) -> float:
        manager = Manager(MemoryStore(), Options(key_prefix="bench", lease=60, telemetry=make()))
        payloads = [order(next(counter)) for _ in range(calls)]

        async def go() -> None:
            for payload in payloads:
                await manager.execute(payload, functools.partial(_result, payload), timeout=TIMEOUT)

        start = _clock()
        loop.run_until_complete(go())
        return (_clock() - start) / calls * 1e6

    def replay(make: Callable[[], Telemetry | None]) -> float:
        manager = Manager(MemoryStore(), Options(key_prefix="bench", lease=60, telemetry=make()))
        payload = order(0)
        timing: list[float] = []

        async def go() -> None:
            await manager.execute(payload, lambda: _result(payload), timeout=TIMEOUT)
            start = _clock()
            for _ in range(calls):
                await manager.execute(payload, lambda: _result(payload), timeout=TIMEOUT)
            timing.append(_clock() - start)

        loop.run_until_complete(go())
        return timing[0] / calls * 1e6

    runs: dict[str, Callable[[], float]] = {}
    for name, make in configurations.items():
        runs[f"{name} first"] = functools.partial(first, make)
        runs[f"{name} replay"] = functools.partial(replay, make)
    for run in runs.values():  # warm up
        run()
    medians = interleaved(runs, repeats=repeats)
    loop.close()
    return medians


_CHILD = """
import json, logging, sys, warnings
sys.path[:0] = [{tree!r}, {tree!r} + "/benchmarks"]
import time
import bench_manager
bench_manager.REPEATS = {repeats}
if {cpu!r}:
    # CPU time of this process: other processes' load on a shared machine does not count.
    bench_manager.time.perf_counter = time.process_time
logging.getLogger("idempotency_async").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
print(json.dumps(bench_manager.per_call_overhead({calls}, deadline=True)))
"""


def against_baseline(baseline: Path, rounds: int, calls: int, *, cpu: bool) -> None:
    """Alternate subprocess runs of each tree's bench_manager per-call overhead."""
    trees = {"baseline": baseline.resolve(), "current": HERE}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            code = _CHILD.format(tree=str(tree), repeats=3, calls=calls, cpu=cpu)
            out = subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            ).stdout
            samples[name].append(json.loads(out.strip().splitlines()[-1]))
    clock = "CPU time" if cpu else "wall time"
    print(f"bench_manager per-call overhead, {rounds} alternating rounds, medians (µs, {clock})")
    for kind in ("first", "replay"):
        ours = {n: statistics.median(s[f"ours {kind}"] for s in samples[n]) for n in trees}
        paired = statistics.median(
            now[f"ours {kind}"] / then[f"ours {kind}"]
            for then, now in zip(samples["baseline"], samples["current"], strict=True)
        )
        rel = {
            n: statistics.median(s[f"ours {kind}"] / s[f"anchor {kind}"] for s in samples[n])
            for n in trees
        }
        print(
            f"  {kind:<7} baseline {ours['baseline']:6.2f}  current {ours['current']:6.2f}  "
            f"current/baseline {ours['current'] / ours['baseline']:.3f} "
            f"(paired {paired:.3f})   "
            f"(ours/anchor {rel['baseline']:.3f} -> {rel['current']:.3f}, "
            f"moved {rel['current'] / rel['baseline']:.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wall", action="store_true", help="--baseline: wall, not CPU, time")
    args = parser.parse_args()
    if args.baseline is not None:
        against_baseline(args.baseline, args.rounds, 200 if args.smoke else 3000, cpu=not args.wall)
        return
    repeats = args.repeats or (1 if args.smoke else 9)
    calls = 200 if args.smoke else 3000
    medians = per_call(calls, repeats)
    print(f"Per-call CPU time, µs (median of {repeats} interleaved repeats, {calls} calls each)")
    for kind in ("first", "replay"):
        plain = medians[f"plain {kind}"]
        noop, sdk = medians[f"otel no-op {kind}"], medians[f"otel sdk {kind}"]
        print(
            f"  {kind:<7} plain {plain:6.2f}   otel no-op {noop:6.2f} ({noop / plain:.2f}x)   "
            f"otel sdk {sdk:6.2f} ({sdk / plain:.2f}x)"
        )


if __name__ == "__main__":
    main()
