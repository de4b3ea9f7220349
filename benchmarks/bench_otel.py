"""What OpenTelemetry costs per call, and what the hooks cost when it is not configured.

    python benchmarks/bench_otel.py                       # in-process comparison, ~30 s
    python benchmarks/bench_otel.py --smoke               # a few seconds, for CI
    python benchmarks/bench_otel.py --baseline /tmp/base  # this tree vs another checkout

The in-process run times first calls and replays (MemoryStore, default options, a deadline
on every call, a fresh payload and callback per call) for a manager without telemetry, with
``Telemetry()`` while the API's global providers are the no-op ones, and with SDK providers
that record everything (no exporter): chunks in rotated rounds, ratios within rounds.
``--baseline`` alternates fresh interpreters that import each tree's own package and time
``execute`` there, and compares them within rounds; see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _stats import Clock, Timing, load, median_of, paired, ratios, rotated_rounds

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.otel import Telemetry

TIMEOUT = 10.0
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


def per_call(calls: int, rounds: int) -> dict[str, list[Timing]]:
    """Chunks of first calls and replays for each configuration, in rotated rounds."""
    loop = asyncio.new_event_loop()
    counter = iter(range(10**9))
    configurations: dict[str, Callable[[], Telemetry | None]] = {
        "plain": lambda: None,
        "otel no-op": Telemetry,
        "otel sdk": _sdk_telemetry,
    }

    def first(make: Callable[[], Telemetry | None]) -> Timing:
        manager = Manager(MemoryStore(), Options(telemetry=make()))
        payloads = [order(next(counter)) for _ in range(calls)]

        async def go() -> Timing:
            with Clock() as clock:
                for payload in payloads:
                    await manager.execute(
                        payload, lambda payload=payload: _result(payload), timeout=TIMEOUT
                    )
            return clock.per_call(calls)

        return loop.run_until_complete(go())

    def replay(make: Callable[[], Telemetry | None]) -> Timing:
        manager = Manager(MemoryStore(), Options(telemetry=make()))
        payloads = [order(0) for _ in range(calls)]  # fresh copies of one order

        async def go() -> Timing:
            await manager.execute(order(0), lambda: _result(order(0)), timeout=TIMEOUT)
            with Clock() as clock:
                for payload in payloads:
                    await manager.execute(
                        payload, lambda payload=payload: _result(payload), timeout=TIMEOUT
                    )
            return clock.per_call(calls)

        return loop.run_until_complete(go())

    runs: dict[str, Callable[[], Timing]] = {}
    for name, make in configurations.items():
        runs[f"{name} first"] = functools.partial(first, make)
        runs[f"{name} replay"] = functools.partial(replay, make)
    for run in runs.values():  # warm up
        run()
    samples = rotated_rounds(runs, rounds)
    loop.close()
    return samples


_CHILD = """
import asyncio, json, logging, sys, time
sys.path[:0] = [{tree!r}]
from idempotency_async import Manager, MemoryStore, Options
logging.getLogger("idempotency_async").setLevel(logging.ERROR)
clock = time.process_time if {cpu!r} else time.perf_counter

async def result(payload):
    return {{"order": payload["id"], "status": "charged"}}

def order(n):
    return {{"id": f"ord-{{n}}", "amount": 10 + n % 90, "currency": "EUR", "customer": "c-1"}}

async def main():
    out = {{}}
    manager = Manager(MemoryStore(max_records=10**7), Options())
    for kind, payloads in (("first", [order(n) for n in range({calls})]),
                           ("replay", [order(0) for _ in range({calls})])):
        started = clock()
        for p in payloads:
            await manager.execute(p, lambda p=p: result(p), timeout=10)
        out[kind] = (clock() - started) / {calls} * 1e6
    print(json.dumps(out))

asyncio.run(main())
"""


def against_baseline(baseline: Path, rounds: int, calls: int, *, cpu: bool) -> None:
    """Alternate fresh interpreters importing each tree's package; ratios within rounds."""
    trees = {"baseline": baseline.resolve(), "current": HERE}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for number in range(rounds):
        names = list(trees)[number % 2 :] + list(trees)[: number % 2]
        for name in names:
            code = _CHILD.format(tree=str(trees[name]), calls=calls, cpu=cpu)
            out = subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            ).stdout
            samples[name].append(json.loads(out.strip().splitlines()[-1]))
    clock = "CPU time" if cpu else "wall time"
    print(f"Manager.execute per call, {rounds} alternating rounds (µs, {clock})")
    for kind in ("first", "replay"):
        then = [sample[kind] for sample in samples["baseline"]]
        now = [sample[kind] for sample in samples["current"]]
        print(
            f"  {kind:<7} baseline {statistics.median(then):6.2f}  current "
            f"{statistics.median(now):6.2f}  current/baseline within rounds {paired(now, then)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare against")
    parser.add_argument("--wall", action="store_true", help="--baseline: wall, not CPU, time")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}; {load()}")
    if args.baseline is not None:
        rounds = args.rounds or 9
        against_baseline(args.baseline, rounds, 200 if args.smoke else 3000, cpu=not args.wall)
        return
    rounds = args.rounds or (1 if args.smoke else 21)
    calls = 100 if args.smoke else 500
    samples = per_call(calls, rounds)
    print(
        f"Per call, µs ({rounds} rounds of {calls} calls, order rotated; CPU and wall medians;"
        " ratios to plain on CPU within rounds, median and range)"
    )
    for kind in ("first", "replay"):
        plain = samples[f"plain {kind}"]
        line = f"  {kind:<7} plain {median_of(plain):6.2f} {median_of(plain, 'wall'):6.2f}"
        for name in ("otel no-op", "otel sdk"):
            sample = samples[f"{name} {kind}"]
            line += (
                f"   {name} {median_of(sample):6.2f} {median_of(sample, 'wall'):6.2f}"
                f" ({ratios(sample, plain)}x)"
            )
        print(line)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
