"""The test kit as an opt-in pytest plugin: the ``idempotency_kit`` fixture.

Enable it explicitly — ``pytest -p idempotency_async.testing.pytest_plugin``, or
``pytest_plugins = ["idempotency_async.testing.pytest_plugin"]`` in your top-level
``conftest.py``; the package registers no entry point, so installing it changes no test
run.  Options: ``--idempotency-kit-examples N`` (payloads drawn from a strategy, default
5) and ``--idempotency-kit-seed S`` (default 0).  The kit imports hypothesis only when it
is given a strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from idempotency_async.stores.base import Store
from idempotency_async.testing.kit import KitReport, Scenario, Target, check_handler, replay

__all__ = ["Kit", "idempotency_kit", "pytest_addoption", "pytest_terminal_summary"]

_REPORTS = pytest.StashKey[list[tuple[str, KitReport]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("idempotency-kit", "idempotency-async test kit")
    group.addoption(
        "--idempotency-kit-examples",
        type=int,
        default=5,
        help="payloads the kit draws from a hypothesis strategy (default 5)",
    )
    group.addoption(
        "--idempotency-kit-seed",
        type=int,
        default=0,
        help="seed of the payloads drawn (default 0)",
    )


@dataclass(slots=True)
class Kit:
    """What the ``idempotency_kit`` fixture gives: :func:`check_handler` and :func:`replay`
    with the command line's settings, each report kept for the run's summary."""

    examples: int
    seed: int
    test: str
    reports: list[tuple[str, KitReport]] = field(default_factory=list)

    def check(
        self,
        target: Target,
        *,
        payloads: Any,
        effects: Callable[[], int],
        store: Callable[[], Store] | None = None,
        downstream: bool = False,
    ) -> KitReport:
        report = check_handler(
            target,
            payloads=payloads,
            effects=effects,
            store=store,
            downstream=downstream,
            examples=self.examples,
            seed=self.seed,
        )
        self.reports.append((self.test, report))
        return report

    def replay(
        self,
        target: Target,
        scenario: Scenario,
        *,
        effects: Callable[[], int],
        store: Callable[[], Store] | None = None,
        downstream: bool = False,
    ) -> None:
        replay(target, scenario, effects=effects, store=store, downstream=downstream)


@pytest.fixture
def idempotency_kit(request: pytest.FixtureRequest) -> Kit:
    """Checks your idempotent handler against duplicates, crashes, faults and expiry."""
    config = request.config
    reports = config.stash.setdefault(_REPORTS, [])
    return Kit(
        config.getoption("--idempotency-kit-examples"),
        config.getoption("--idempotency-kit-seed"),
        request.node.nodeid,
        reports,
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for test, report in config.stash.get(_REPORTS, []):
        terminalreporter.write_line(
            f"idempotency kit: {test}: {report.payloads} payload(s), {report.scenarios} "
            f"scenario runs in {report.seconds:.2f} s, {report.mode} mode"
        )
