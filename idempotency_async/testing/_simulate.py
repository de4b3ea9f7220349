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
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.stores.base import RecordsSteps, Store
from idempotency_async.stores.memory import MemoryStore
from idempotency_async.testing._coverage import Coverage, coverage_of
from idempotency_async.testing._describe import describe_trace
from idempotency_async.testing._oracle import check
from idempotency_async.testing._run import run_scenario
from idempotency_async.testing._scenario import Scenario, generate
from idempotency_async.testing._shrink import shrink_scenario
from idempotency_async.testing._vloop import Deadlock, VirtualClockLoop

__all__ = [
    "SimulationFailure",
    "SimulationReport",
    "StoreFactory",
    "reproducer",
    "run_live",
    "run_one",
    "simulate",
    "simulate_live",
]

StoreFactory = Callable[[], Store | Awaitable[Store]]
"""Makes a fresh, empty store for one scenario (called inside the scenario's loop)."""


class SimulationFailure(AssertionError):
    """A scenario broke the guarantee.  ``str()`` says how to rerun it; ``shrunk`` is the
    smallest scenario found that still breaks it (``None`` when not shrunk)."""

    def __init__(
        self,
        scenario: Scenario,
        violations: list[str],
        rerun: str,
        shrunk: Scenario | None = None,
        shrunk_violations: list[str] | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed
        self.violations = violations
        self.rerun = rerun
        self.shrunk = shrunk
        self.shrunk_violations = shrunk_violations
        text = "\n".join(f"  - {violation}" for violation in violations)
        message = (
            f"seed {scenario.seed} broke the guarantee:\n{text}\n{scenario.describe()}\n"
            f"rerun: {rerun}\nthis scenario exactly: {reproducer(scenario)}"
        )
        if scenario.live:
            message += (
                "\nin real time, with the same faults: await idempotency_async.testing."
                f"run_live(<store factory>, Scenario.from_json({scenario.to_json()!r}))"
            )
        if shrunk is not None:
            found = "\n".join(f"  - {violation}" for violation in shrunk_violations or ())
            message += (
                f"\nshrunk to {len(shrunk.calls)} call(s), {len(shrunk.managers)} manager(s), "
                f"{sum(len(call.faults) for call in shrunk.calls)} fault(s):\n{found}\n"
                f"{shrunk.describe()}\nreproduce: {reproducer(shrunk)}"
            )
        super().__init__(message)

    def __reduce__(self) -> Any:
        # Raised in a worker process: rebuilt from its parts in the parent.
        parts = (self.scenario, self.violations, self.rerun, self.shrunk, self.shrunk_violations)
        return (SimulationFailure, parts)


def reproducer(scenario: Scenario) -> str:
    """The command that runs ``scenario`` alone against MemoryStore on a virtual clock."""
    return f"python -m idempotency_async.testing --scenario '{scenario.to_json()}'"


@dataclass(slots=True)
class SimulationReport:
    """What a simulation ran."""

    scenarios: int = 0
    calls: int = 0
    faults: int = 0
    store_operations: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    coverage: Coverage = field(default_factory=Coverage)
    """The pairs of axis values and the named triples the run crossed."""
    excluded: tuple[str, ...] = ()
    """The generator features the run left out (their pairs were not due)."""

    def summary(self, *, coverage: bool = True) -> str:
        """What ran, its outcomes, and (``coverage``) the pairs and triples it crossed."""
        top = sorted(self.outcomes.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{name} {count}" for name, count in top)
        text = (
            f"{self.scenarios} scenarios, {self.calls} calls, {self.faults} faults, "
            f"{self.store_operations} store operations in {self.seconds:.1f} s; outcomes: "
            f"{shown}"
        )
        if coverage:
            text += f"\ncoverage: {self.coverage.summary(self.excluded)}"
        return text

    def merge(self, part: SimulationReport) -> None:
        self.scenarios += part.scenarios
        self.calls += part.calls
        self.faults += part.faults
        self.store_operations += part.store_operations
        self.excluded = tuple(sorted({*self.excluded, *part.excluded}))
        for name, count in part.outcomes.items():
            self.outcomes[name] = self.outcomes.get(name, 0) + count
        self.coverage.add(part.coverage)


def _rerun(
    seed: int,
    scale: float,
    exclude: Collection[str] = (),
    live: bool = False,
    server_clock: bool | None = None,
) -> str:
    """The command generating the same scenario from its seed (on MemoryStore, in virtual
    time): with the same scale, features left out, and — for a real-time run's scenario —
    ``--live`` and its store's clock, which change what a seed generates."""
    extra = "" if scale == 1.0 else f" --scale {scale}"
    if exclude:
        extra += f" --exclude {','.join(sorted(exclude))}"
    if live:
        extra += " --live"
    if server_clock:
        extra += " --server-clock"
    return f"python -m idempotency_async.testing --seed {seed}{extra}"


async def _store(factory: StoreFactory, scenario: Scenario) -> Store:
    if scenario.capacity is not None and factory is MemoryStore:
        return MemoryStore(max_records=scenario.capacity)  # a store that fills up
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
    exclude: Collection[str] = (),
    server_clock: bool | None = None,
) -> None:
    scenario = generate(seed, scale=scale, live=live, exclude=exclude, server_clock=server_clock)
    store = await _store(factory, scenario)
    if "steps" not in exclude and not isinstance(store, RecordsSteps):
        # A store that does not record steps: its scenarios take none (the coverage of
        # steps is not due), and the rerun says so.
        exclude = (*exclude, "steps")
        if "steps" not in report.excluded:
            report.excluded = tuple(sorted((*report.excluded, "steps")))
        scenario = generate(
            seed, scale=scale, live=live, exclude=exclude, server_clock=server_clock
        )
    violations = await _violations(scenario, factory, live, tolerance, report, store)
    if violations:
        rerun = _rerun(seed, scale, exclude, live, server_clock)
        raise SimulationFailure(scenario, violations, rerun)


async def _violations(
    scenario: Scenario,
    factory: StoreFactory,
    live: bool,
    tolerance: float,
    report: SimulationReport | None = None,
    store: Store | None = None,
) -> list[str]:
    if store is None:
        store = await _store(factory, scenario)
    try:
        trace = await run_scenario(
            scenario,
            store,
            stuck_after=60.0 if live else 100_000.0,
            epilogue=not live,
            own_clock=live and scenario.server_clock,
            # Live runs share a server's keyspace with other runs of the same seeds.
            namespace=f"-{secrets.token_hex(4)}" if live else "",
            real_time=live,
        )
    finally:
        await store.aclose()
    violations = check(trace, tolerance=tolerance)
    if report is None:
        return violations
    report.scenarios += 1
    report.calls += len(scenario.calls)
    report.faults += sum(len(call.faults) for call in scenario.calls)
    report.store_operations += len(trace.store.ops)
    report.coverage.add(coverage_of(trace))
    for outcome in trace.outcomes:
        name = "value" if outcome.error is None else type(outcome.error).__name__
        report.outcomes[name] = report.outcomes.get(name, 0) + 1
    return violations


def run_one(scenario: Scenario, store_factory: StoreFactory = MemoryStore) -> list[str]:
    """Run one scenario on a virtual clock; the violations of the guarantee it shows."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(_violations(scenario, store_factory, False, 1e-6))
    except Deadlock as exc:
        return [f"deadlock: {exc}"]
    finally:
        loop.close()


def simulate(
    store_factory: StoreFactory,
    seeds: Iterable[int] = range(1000),
    *,
    scale: float = 1.0,
    workers: int = 1,
    exclude: Collection[str] = (),
    shrink: bool = True,
) -> SimulationReport:
    """Run the scenarios of ``seeds`` against fresh stores from ``store_factory``, on a
    virtual clock: a lease of minutes passes instantly.  For stores with no real I/O (an
    in-process store, or a fake of a server); call it outside any running event loop.

    ``workers`` > 1 splits the seeds over that many processes (``store_factory`` must
    then be picklable, e.g. a class or a module-level function).  ``exclude`` leaves out
    some of the generator's :data:`FEATURES`.  A failing seed is shrunk to a minimal
    scenario (``shrink``), printed with a command that reproduces it.
    """
    if workers > 1:
        return _in_processes(store_factory, list(seeds), scale, workers, exclude, shrink)
    report = SimulationReport(excluded=tuple(sorted(exclude)))
    started = time.perf_counter()
    for seed in seeds:
        # A fresh loop per scenario: the clock starts at 0, so a seed replays exactly.
        loop = VirtualClockLoop()
        try:
            loop.run_until_complete(_one(seed, store_factory, scale, False, 1e-6, report, exclude))
        except Deadlock as exc:
            failure = SimulationFailure(
                generate(seed, scale=scale, exclude=exclude),
                [f"deadlock: {exc}"],
                _rerun(seed, scale, exclude),
            )
            raise _shrunk(failure, store_factory) if shrink else failure from exc
        except SimulationFailure as failure:
            if not shrink:
                raise
            raise _shrunk(failure, store_factory) from None
        finally:
            loop.close()
    report.seconds = time.perf_counter() - started
    return report


def _shrunk(failure: SimulationFailure, store_factory: StoreFactory) -> SimulationFailure:
    smallest, violations = shrink_scenario(
        failure.scenario, lambda scenario: run_one(scenario, store_factory), failure.violations
    )
    return SimulationFailure(
        failure.scenario, failure.violations, failure.rerun, smallest, violations
    )


def _in_processes(
    store_factory: StoreFactory,
    seeds: list[int],
    scale: float,
    workers: int,
    exclude: Collection[str],
    shrink: bool,
) -> SimulationReport:
    started = time.perf_counter()
    chunks = [seeds[index::workers] for index in range(workers)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = list(
            pool.map(
                _chunk,
                [store_factory] * workers,
                chunks,
                [scale] * workers,
                [tuple(exclude)] * workers,
                [shrink] * workers,
            )
        )
    report = SimulationReport(excluded=tuple(sorted(exclude)))
    for part in parts:
        report.merge(part)
    report.seconds = time.perf_counter() - started
    return report


def _chunk(
    store_factory: StoreFactory,
    seeds: list[int],
    scale: float,
    exclude: tuple[str, ...],
    shrink: bool,
) -> SimulationReport:
    return simulate(store_factory, seeds, scale=scale, exclude=exclude, shrink=shrink)


async def simulate_live(
    store_factory: StoreFactory,
    seeds: Iterable[int] = range(100),
    *,
    scale: float = 0.1,
    concurrency: int = 8,
    tolerance: float = 0.05,
    exclude: Collection[str] = (),
    server_clock: bool = False,
) -> SimulationReport:
    """Run the scenarios of ``seeds`` in real time in the running loop (stores that talk to
    a server), ``concurrency`` at a time, every duration times ``scale``.

    Real time is not reproducible to the microsecond: a rerun repeats the scenario and its
    faults, not necessarily the interleaving (a failure prints the scenario itself, to run
    again with :func:`run_live`).  No timing verdict depends on the machine's load: the
    loop's lag is sampled all along, and a timing check allows ``tolerance`` (seconds) plus
    the lag seen while it was due.  ``server_clock``: the store judges by a clock of its own
    (Redis ``TIME``), so the managers' clocks may be skewed.
    """
    report = SimulationReport(excluded=tuple(sorted(exclude)))
    started = time.perf_counter()
    pending = iter(seeds)

    async def worker() -> None:
        for seed in pending:
            await _one(
                seed,
                store_factory,
                scale,
                True,
                tolerance,
                report,
                exclude,
                server_clock or None,
            )

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    except* SimulationFailure as failures:
        # As documented: the failure itself, not the task group's wrapping of it.
        raise failures.exceptions[0] from None
    report.seconds = time.perf_counter() - started
    return report


async def run_live(
    store_factory: StoreFactory, scenario: Scenario, *, tolerance: float = 0.05
) -> list[str]:
    """Run one scenario (as a real-time failure printed it) in real time in the running loop,
    with its faults; the violations of the guarantee it shows.  The store must judge by
    its own clock exactly when ``scenario.server_clock`` says so."""
    return await _violations(scenario, store_factory, True, tolerance)


def trace_text(scenario: Scenario) -> str:
    """The full trace of ``scenario`` on MemoryStore, as text (``--verbose``)."""
    loop = VirtualClockLoop()
    try:
        store = loop.run_until_complete(_store(MemoryStore, scenario))
        trace = loop.run_until_complete(run_scenario(scenario, store))
    finally:
        loop.close()
    return describe_trace(trace)
