"""Running the fault simulator (the command line is ``python -m idempotency_async.testing``).

:func:`simulate` runs scenarios on a virtual clock (thousands per second on an in-process
store); :func:`simulate_live` runs them in real time in the running loop, for stores that
talk to a server.  Either raises :class:`SimulationFailure` on the first scenario that
breaks the guarantee, with the seed, the scenario and the violations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from idempotency_async.stores.base import Store
from idempotency_async.testing._oracle import check
from idempotency_async.testing._run import describe_trace, run_scenario
from idempotency_async.testing._scenario import Scenario, generate
from idempotency_async.testing._vloop import Deadlock, VirtualClockLoop

__all__ = ["SimulationFailure", "SimulationReport", "StoreFactory", "simulate", "simulate_live"]

StoreFactory = Callable[[], Store | Awaitable[Store]]
"""Makes a fresh, empty store for one scenario (called inside the scenario's loop)."""


class SimulationFailure(AssertionError):
    """A scenario broke the guarantee.  ``str()`` says how to rerun it."""

    def __init__(self, scenario: Scenario, violations: list[str], rerun: str) -> None:
        self.scenario = scenario
        self.seed = scenario.seed
        self.violations = violations
        text = "\n".join(f"  - {violation}" for violation in violations)
        super().__init__(
            f"seed {scenario.seed} broke the guarantee:\n{text}\n{scenario.describe()}\n"
            f"rerun: {rerun}"
        )


@dataclass(slots=True)
class SimulationReport:
    """What a simulation ran."""

    scenarios: int = 0
    calls: int = 0
    faults: int = 0
    store_operations: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        top = sorted(self.outcomes.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{name} {count}" for name, count in top)
        return (
            f"{self.scenarios} scenarios, {self.calls} calls, {self.faults} faults, "
            f"{self.store_operations} store operations in {self.seconds:.1f} s; outcomes: {shown}"
        )


def _rerun(seed: int, scale: float) -> str:
    extra = "" if scale == 1.0 else f" --scale {scale}"
    return f"python -m idempotency_async.testing --seed {seed}{extra}"


async def _store(factory: StoreFactory) -> Store:
    made = factory()
    if inspect.isawaitable(made):
        return await made
    return made


async def _one(
    seed: int,
    factory: StoreFactory,
    scale: float,
    live: bool,
    tolerance: float,
    report: SimulationReport,
) -> None:
    scenario = generate(seed, scale=scale, live=live)
    store = await _store(factory)
    try:
        trace = await run_scenario(scenario, store, stuck_after=60.0 if live else 100_000.0)
    finally:
        await store.aclose()
    violations = check(trace, tolerance=tolerance)
    report.scenarios += 1
    report.calls += len(scenario.calls)
    report.faults += sum(len(call.faults) for call in scenario.calls)
    report.store_operations += len(trace.store.ops)
    for outcome in trace.outcomes:
        name = "value" if outcome.error is None else type(outcome.error).__name__
        report.outcomes[name] = report.outcomes.get(name, 0) + 1
    if violations:
        raise SimulationFailure(scenario, violations, _rerun(seed, scale))


def simulate(
    store_factory: StoreFactory,
    seeds: Iterable[int] = range(1000),
    *,
    scale: float = 1.0,
    workers: int = 1,
) -> SimulationReport:
    """Run the scenarios of ``seeds`` against fresh stores from ``store_factory``, on a
    virtual clock: a lease of minutes passes instantly.  For stores with no real I/O (an
    in-process store, or a fake of a server); call it outside any running event loop.

    ``workers`` > 1 splits the seeds over that many processes (``store_factory`` must
    then be picklable, e.g. a class or a module-level function).
    """
    if workers > 1:
        return _in_processes(store_factory, list(seeds), scale, workers)
    report = SimulationReport()
    started = time.perf_counter()
    for seed in seeds:
        # A fresh loop per scenario: the clock starts at 0, so a seed replays exactly.
        loop = VirtualClockLoop()
        try:
            loop.run_until_complete(_one(seed, store_factory, scale, False, 1e-6, report))
        except Deadlock as exc:
            raise SimulationFailure(
                generate(seed, scale=scale), [f"deadlock: {exc}"], _rerun(seed, scale)
            ) from exc
        finally:
            loop.close()
    report.seconds = time.perf_counter() - started
    return report


def _in_processes(
    store_factory: StoreFactory, seeds: list[int], scale: float, workers: int
) -> SimulationReport:
    started = time.perf_counter()
    chunks = [seeds[index::workers] for index in range(workers)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = list(pool.map(_chunk, [store_factory] * workers, chunks, [scale] * workers))
    report = SimulationReport()
    for part in parts:
        report.scenarios += part.scenarios
        report.calls += part.calls
        report.faults += part.faults
        report.store_operations += part.store_operations
        for name, count in part.outcomes.items():
            report.outcomes[name] = report.outcomes.get(name, 0) + count
    report.seconds = time.perf_counter() - started
    return report


def _chunk(store_factory: StoreFactory, seeds: list[int], scale: float) -> SimulationReport:
    return simulate(store_factory, seeds, scale=scale)


async def simulate_live(
    store_factory: StoreFactory,
    seeds: Iterable[int] = range(100),
    *,
    scale: float = 0.1,
    concurrency: int = 8,
    tolerance: float = 0.05,
) -> SimulationReport:
    """Run the scenarios of ``seeds`` in real time in the running loop (stores that talk to
    a server), ``concurrency`` at a time, every duration times ``scale``.

    Real time is not reproducible to the microsecond: a rerun repeats the scenario and its
    faults, not necessarily the interleaving; ``tolerance`` (seconds) absorbs loop lag in
    the timing checks.
    """
    report = SimulationReport()
    started = time.perf_counter()
    pending = iter(seeds)

    async def worker() -> None:
        for seed in pending:
            await _one(seed, store_factory, scale, True, tolerance, report)

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    report.seconds = time.perf_counter() - started
    return report


def trace_text(seed: int, scale: float) -> str:
    from idempotency_async.stores.memory import MemoryStore

    loop = VirtualClockLoop()
    try:
        trace = loop.run_until_complete(run_scenario(generate(seed, scale=scale), MemoryStore()))
    finally:
        loop.close()
    return describe_trace(trace)
