"""The fault simulator for transactional calls on a live PostgreSQL server.

:func:`simulate_transactions` runs generated transactional scenarios
(:mod:`idempotency_async.testing._tx_scenario`) against a real server and checks each with
an oracle of its own (:mod:`idempotency_async.testing._tx_oracle`): exactly once for the
database effect.  A failing scenario is shrunk (rerun on the server) and printed as JSON
that :func:`run_transactional_scenario` runs again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from idempotency_async.errors import ConfigError
from idempotency_async.testing._shrink import shrink_live
from idempotency_async.testing._simulate import SimulationReport
from idempotency_async.testing._tx_oracle import check_transactional
from idempotency_async.testing._tx_run import run_transactional
from idempotency_async.testing._tx_scenario import (
    TxScenario,
    generate_transactional,
    simpler_transactional,
)

__all__ = [
    "TransactionSimulationFailure",
    "run_transactional_scenario",
    "simulate_transactions",
]


class TransactionSimulationFailure(AssertionError):
    """A transactional scenario broke the guarantee; ``shrunk`` is the smallest scenario
    found that still breaks it (``None`` when not shrunk)."""

    def __init__(
        self,
        scenario: TxScenario,
        violations: list[str],
        shrunk: TxScenario | None = None,
        shrunk_violations: list[str] | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed
        self.violations = violations
        self.shrunk = shrunk
        self.shrunk_violations = shrunk_violations
        text = "\n".join(f"  - {violation}" for violation in violations)
        message = f"transactional seed {scenario.seed} broke the guarantee:\n{text}\n"
        message += scenario.describe()
        if shrunk is not None:
            found = "\n".join(f"  - {violation}" for violation in shrunk_violations or ())
            message += (
                f"\nshrunk to {len(shrunk.calls)} call(s):\n{found}\n{shrunk.describe()}\n"
                "reproduce: await run_transactional_scenario(dsn, TxScenario.from_json("
                f"'{shrunk.to_json()}'))"
            )
        super().__init__(message)


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise ConfigError(
            "the transactional simulator needs asyncpg: pip install 'idempotency-async[postgres]'"
        ) from exc
    return asyncpg


async def run_transactional_scenario(
    dsn: str, scenario: TxScenario, *, tolerance: float = 1.0
) -> list[str]:
    """Run one scenario against the server at ``dsn``; the violations it shows."""
    asyncpg = _asyncpg()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=len(scenario.calls) + 2)
    try:
        return await _violations(scenario, pool, dsn, tolerance)
    finally:
        await pool.close()


async def _violations(
    scenario: TxScenario,
    pool: Any,
    dsn: str,
    tolerance: float,
    report: SimulationReport | None = None,
) -> list[str]:
    trace = await run_transactional(scenario, pool, dsn)
    violations = check_transactional(trace, tolerance=tolerance)
    if report is not None:
        report.scenarios += 1
        report.calls += len(scenario.calls)
        report.faults += sum(call.fault != "none" for call in scenario.calls)
        for outcome in trace.outcomes:
            if outcome.error is not None:
                name = type(outcome.error).__name__
            elif not outcome.returned_value:
                name = "unfinished"
            else:
                name = "run" if outcome.value == outcome.writer else "replay"
            report.outcomes[name] = report.outcomes.get(name, 0) + 1
    return violations


async def simulate_transactions(
    dsn: str,
    seeds: Iterable[int] = range(50),
    *,
    scale: float = 1.0,
    concurrency: int = 4,
    tolerance: float = 1.0,
    shrink: bool = True,
) -> SimulationReport:
    """Run the transactional scenarios of ``seeds`` against the PostgreSQL server at
    ``dsn``, ``concurrency`` at a time, each on tables of its own (dropped afterwards).

    Raises :class:`TransactionSimulationFailure` on the first scenario that breaks the
    guarantee, shrunk unless ``shrink`` is false.  ``tolerance`` (seconds) absorbs loop
    lag in the lock-wait bounds.  Real time: a rerun repeats the scenario and its faults,
    not necessarily the interleaving.
    """
    asyncpg = _asyncpg()
    report = SimulationReport()
    started = time.perf_counter()
    pending = iter(seeds)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=concurrency * 10 + 2)

    async def worker() -> None:
        for seed in pending:
            scenario = generate_transactional(seed, scale=scale)
            violations = await _violations(scenario, pool, dsn, tolerance, report)
            if violations:
                raise TransactionSimulationFailure(scenario, violations)

    try:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(worker())
        except* TransactionSimulationFailure as failures:
            failure = failures.exceptions[0]
            assert isinstance(failure, TransactionSimulationFailure)
            if not shrink:
                raise failure from None
            smallest, found = await shrink_live(
                failure.scenario,
                lambda candidate: _violations(candidate, pool, dsn, tolerance),
                failure.violations,
                simpler_transactional,
            )
            raise TransactionSimulationFailure(
                failure.scenario, failure.violations, smallest, found
            ) from None
    finally:
        await pool.close()
    report.seconds = time.perf_counter() - started
    return report
