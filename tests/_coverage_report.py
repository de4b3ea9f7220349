"""The fault simulator's coverage, printed at the end of the test run (``conftest``'s
terminal summary): what each simulator run crossed, in CI's output, pass or fail."""

from __future__ import annotations

from idempotency_async.testing import SimulationReport

REPORTS: list[tuple[str, str]] = []


def record(name: str, report: SimulationReport, *, pairs: bool = True) -> None:
    """Keep ``report``'s summary for the run's: scenarios, seconds and — ``pairs`` — the
    pairs and named triples crossed (real-time runs, not held to every pair, say how many
    they crossed)."""
    if pairs:
        REPORTS.append((name, report.summary()))
        return
    crossed = len(report.coverage.pairs)
    REPORTS.append((name, f"{report.summary(coverage=False)}; {crossed} pairs crossed"))
