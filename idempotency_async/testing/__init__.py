"""Conformance kit for idempotency-async stores: the store contract suite and the fault
simulator.

``simulate(store_factory, seeds)`` runs generated scenarios — several managers sharing one
store; calls through ``execute``, ``execute_call`` (every completion pattern), decorated
functions, SQS batches (with a Lambda context), the HTTP gate and an operator's
``force_release``; renewal, local caches, server clocks and skew; callbacks of every shape
and outcome; every store error before and after its write applied, slow, lost and late
answers on every operation — crossing these features pairwise (``SimulationReport.coverage``
says which pairs and named triples a run crossed), and checks the guarantee after each
with an oracle judging against the plan; a failing scenario is shrunk and printed as a
``--scenario`` reproducer (``run_live`` reruns a real-time one with its faults).
``simulate_transactions(dsn, seeds)`` does the same for transactional calls
(``Manager.execute_in_transaction``) on a live PostgreSQL server (it needs asyncpg).
``StoreContract`` is the protocol's pytest suite, to subclass with a ``store`` fixture;
``StepsContract`` adds the obligations of stores that record steps (``RecordsSteps``).
Both need pytest and pytest-asyncio (imported when first used); the
simulator needs nothing beyond the library.  See ``docs/stores.md`` and ``docs/guarantees.md``.
``check_handler`` (the users' test kit, ``idempotency_async.testing.kit``) runs your own
handler through duplicates, crashes and expiry: ``docs/testing-your-handler.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idempotency_async.testing._scenario import (
    FEATURES,
    CallPlan,
    Fault,
    ManagerPlan,
    Scenario,
    generate,
)
from idempotency_async.testing._simulate import (
    SimulationFailure,
    SimulationReport,
    StoreFactory,
    reproducer,
    run_live,
    run_one,
    simulate,
    simulate_live,
)
from idempotency_async.testing._transactions import (
    TransactionSimulationFailure,
    run_transactional_scenario,
    simulate_transactions,
)
from idempotency_async.testing._tx_scenario import TxScenario, generate_transactional
from idempotency_async.testing.kit import (
    HandlerCheckFailed,
    KitReport,
    aiohttp_route,
    asgi_route,
    check_handler,
    function_handler,
    lambda_handler,
    sqs_batch_handler,
)

if TYPE_CHECKING:
    from idempotency_async.testing._contract import StepsContract, StoreContract

__all__ = [
    "FEATURES",
    "CallPlan",
    "Fault",
    "HandlerCheckFailed",
    "KitReport",
    "ManagerPlan",
    "Scenario",
    "SimulationFailure",
    "SimulationReport",
    "StepsContract",
    "StoreContract",
    "StoreFactory",
    "TransactionSimulationFailure",
    "TxScenario",
    "aiohttp_route",
    "asgi_route",
    "check_handler",
    "function_handler",
    "generate",
    "generate_transactional",
    "lambda_handler",
    "reproducer",
    "run_live",
    "run_one",
    "run_transactional_scenario",
    "simulate",
    "simulate_live",
    "simulate_transactions",
    "sqs_batch_handler",
]


def __getattr__(name: str) -> Any:
    # The contract suite imports pytest: only when a test suite asks for it.
    if name == "StoreContract":
        from idempotency_async.testing._contract import StoreContract

        return StoreContract
    if name == "StepsContract":
        from idempotency_async.testing._contract import StepsContract

        return StepsContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
