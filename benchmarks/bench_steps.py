"""What a recovery point (``step``) costs on the MemoryStore, beside a call without steps.

    python benchmarks/bench_steps.py               # ~1 min: 21 rounds of 300 calls
    python benchmarks/bench_steps.py --smoke       # a few seconds, CI: checks every step
                                                   # ran once and was recorded

One call at a time on ``Manager(MemoryStore(), Options())``, ``timeout=10``, a fresh
payload and callback per call, the same small work in every contender (a coroutine
returning a small dict per unit of work):

* ``no steps``: the callback awaits the work 3 times itself;
* ``1 step``, ``3 steps``, ``10 steps``: each unit of work is ``await step(name, fn)``
  (3 steps: the same work as ``no steps``, each unit recorded);
* ``resume 3``: a call whose 3 steps are recorded on a released record (a first run
  raised after them), so the call replays them from its claim and runs none.

A round runs a chunk of calls of every contender, in an order rotated each round; ratios
to ``no steps`` are taken within rounds on CPU time (``time.process_time``) and quoted as
median (range); "per step" is the extra CPU of ``10 steps`` over ``no steps``, per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _stats import Clock, Timing, load, median_of, parse_args, ratios, rotated_rounds

from idempotency_async import Event, Manager, MemoryStore, Options, step

TIMEOUT = 10.0
NAMES = [f"step-{n}" for n in range(10)]


async def work(n: int) -> dict[str, Any]:
    return {"unit": n, "status": "done"}


async def no_steps(units: int) -> list[dict[str, Any]]:
    return [await work(n) for n in range(units)]


async def with_steps(units: int) -> list[dict[str, Any]]:
    return [await step(NAMES[n], lambda n=n: work(n)) for n in range(units)]


class Failed(Exception):
    """Raised after the steps, to leave a released record with progress."""


async def then_fail() -> None:
    await with_steps(3)
    raise Failed


class Contenders:
    """Chunks of ``calls`` calls of every contender, on one event loop."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.loop = asyncio.new_event_loop()
        self.numbers = iter(range(10**9))
        self.events: list[Event] = []
        self.ran = 0

    def payloads(self) -> list[dict[str, Any]]:
        return [{"id": f"ord-{next(self.numbers)}"} for _ in range(self.calls)]

    def manager(self) -> Manager:
        return Manager(MemoryStore(max_records=10**7), Options(on_event=self._count))

    def _count(self, event: Event) -> None:
        if event.kind in ("step_recorded", "step_replayed"):
            self.events.append(event)

    def first(self, steps: bool, units: int) -> Timing:
        manager = self.manager()
        payloads = self.payloads()
        callback = with_steps if steps else no_steps

        async def go() -> Timing:
            with Clock() as clock:
                for payload in payloads:
                    await manager.execute(payload, lambda: callback(units), timeout=TIMEOUT)
            self.ran += len(payloads)
            return clock.per_call(self.calls)

        return self.loop.run_until_complete(go())

    def resume(self) -> Timing:
        manager = self.manager()
        payloads = self.payloads()

        async def go() -> Timing:
            for payload in payloads:  # not timed: leave 3 recorded steps on each key
                with contextlib.suppress(Failed):
                    await manager.execute(payload, then_fail, timeout=TIMEOUT)
            with Clock() as clock:
                for payload in payloads:
                    await manager.execute(payload, lambda: with_steps(3), timeout=TIMEOUT)
            self.ran += len(payloads)
            return clock.per_call(self.calls)

        return self.loop.run_until_complete(go())


def main() -> None:
    args = parse_args(__doc__ or "")
    rounds = args.repeats or (3 if args.smoke else 21)
    calls = 50 if args.smoke else 300
    contenders = Contenders(calls)
    runs = {
        "no steps": lambda: contenders.first(False, 3),
        "1 step": lambda: contenders.first(True, 1),
        "3 steps": lambda: contenders.first(True, 3),
        "10 steps": lambda: contenders.first(True, 10),
        "resume 3": contenders.resume,
    }
    print(f"{rounds} rounds of {calls} calls; {load()}")
    samples = rotated_rounds(runs, rounds)
    print(f"{'':<10} {'CPU µs':>8} {'wall µs':>8}  / no steps (CPU)")
    base = samples["no steps"]
    for name, timings in samples.items():
        ratio = "" if name == "no steps" else str(ratios(timings, base))
        print(f"{name:<10} {median_of(timings):>8.2f} {median_of(timings, 'wall'):>8.2f}  {ratio}")
    per_step = statistics.median(
        (ten.cpu - none.cpu) / 10 for ten, none in zip(samples["10 steps"], base, strict=True)
    )
    print(f"per step (10 steps - no steps) / 10: {per_step:.2f} µs CPU")
    print(f"after: {load()}")

    # Every step ran once and was recorded; each resumed call replayed its 3 steps.
    kinds = Counter(event.kind for event in contenders.events)
    per_round = calls * (1 + 3 + 10 + 3)
    assert kinds["step_recorded"] == rounds * per_round, kinds
    assert kinds["step_replayed"] == rounds * calls * 3, kinds
    assert contenders.ran == rounds * calls * len(runs)
    contenders.loop.close()


if __name__ == "__main__":
    main()
