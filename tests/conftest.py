"""Shared fixtures.  ``store`` runs every contract test against each real store."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from _moto import (
    dynamodb_client,
    fresh_store,
    moto_endpoint,
    open_client,
    open_light_client,
    store_client,
    transport,
)
from _postgres import fresh_postgres_store, pgbouncer, postgres_server
from _redis import fresh_redis_store, redis_cluster, redis_server
from hypothesis import HealthCheck, settings
from support import Clock

from idempotency_async import MemoryStore
from idempotency_async.stores.base import Store

# Properties fail on the code's behaviour only, never on a slow machine: no per-example
# deadline and no "data generation too slow" health check.  Built on the profile loaded
# so far, so under CI=true Hypothesis's own "ci" profile (derandomized, no example
# database) still applies.
settings.register_profile(
    "idempotency-async",
    settings(settings.default, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
)
settings.load_profile("idempotency-async")

__all__ = [
    "clock",
    "dynamodb_client",
    "moto_endpoint",
    "pgbouncer",
    "postgres_server",
    "redis_cluster",
    "redis_server",
    "store",
    "store_client",
    "transport",
]

STORES = ["memory", "dynamodb", "dynamodb-light", "redis", "redis-cluster", "postgres"]


@pytest.fixture(autouse=True)
def _no_ambient_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library reads a few environment variables (the Lambda function name as key
    prefix, the Powertools off switch, the CLI's store): one left set in the shell that
    runs the suite would change keys or turn idempotency off.  Tests that need them set
    them with ``monkeypatch``."""
    for name in [*os.environ]:
        if name == "AWS_LAMBDA_FUNCTION_NAME" or name.startswith(
            ("POWERTOOLS_", "IDEMPOTENCY_ASYNC_")
        ):
            monkeypatch.delenv(name)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.aclose()
    elif request.param == "postgres":
        # The client's clock, as for Redis: the suites run in simulated time.
        server = request.getfixturevalue("postgres_server")
        async with fresh_postgres_store(server, judged_by="client") as postgres_store:
            yield postgres_store
    elif request.param.startswith("redis"):
        # The client's clock: the suites run in simulated time (NOW is in 2023).
        cluster = request.param == "redis-cluster"
        server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
        async with fresh_redis_store(server, cluster=cluster, judged_by="client") as redis_store:
            yield redis_store
    elif request.param == "dynamodb-light":
        endpoint = request.getfixturevalue("moto_endpoint")
        async with open_client(endpoint) as client, open_light_client(endpoint) as light:
            dynamodb = await fresh_store(client, store_client=light)
            yield dynamodb
            await dynamodb.aclose()
    else:
        async with open_client(request.getfixturevalue("moto_endpoint")) as client:
            dynamodb = await fresh_store(client)
            yield dynamodb
            await dynamodb.aclose()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist a worker hands its simulator coverage to the controller, whose
    terminal summary prints every worker's."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from _coverage_report import REPORTS

        workeroutput["simulator_coverage"] = [list(report) for report in REPORTS]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` starts at most two workers: each starts its own servers (moto, Redis,
    Postgres), and the real-time tests' tolerances are set for a 2-core machine."""
    return max(1, min(2, os.cpu_count() or 1))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller: collect a finished worker's simulator coverage."""
    from _coverage_report import REPORTS

    output = getattr(node, "workeroutput", {})
    REPORTS.extend((name, summary) for name, summary in output.get("simulator_coverage", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault simulator's coverage (pairs, triples, seeds, seconds) of this run."""
    from _coverage_report import REPORTS

    if not REPORTS:
        return
    terminalreporter.section("fault simulator coverage")
    for name, summary in REPORTS:
        terminalreporter.write_line(f"{name}: {summary}")
