"""Pins the public types: only type-checked (``mypy --strict tests/typing``), never run.

A change that loses a decorated function's signature or an ``execute`` result type
breaks this file under mypy, not at a user's call site.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, assert_type

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from idempotency_async import (
    Call,
    LocalCache,
    Manager,
    MemoryStore,
    Options,
    Renewal,
    ReplayErrors,
    Wait,
    errors,
    idempotent_function,
)

manager = Manager(MemoryStore(), Options(key_prefix="typing"))


@idempotent_function(manager, payload="order", timeout=5)
async def charge(order: dict[str, int], *, note: str = "") -> list[str]:
    return [note]


async def uses() -> None:
    assert_type(await charge({"id": 1}, note="x"), list[str])
    charge({"id": 1}, note=3)  # type: ignore[arg-type]
    assert_type(charge.manager.key_for({"id": 1}), str | None)

    async def work() -> int:
        return 1

    assert_type(await manager.execute({"id": 1}, work, timeout=5), int)
    assert_type(manager.key_for({"id": 1}), str | None)

    async def answers(call: Call) -> str:
        await call.complete("answer")
        return "answer"

    assert_type(await manager.execute_call({"id": 2}, answers, timeout=5), str)


powertools = Options(key_format="powertools-python", powertools_version="3.0")
Options(key_format="powertools")  # type: ignore[arg-type]

# ---------------------------------------------------------------------- HTTP integrations

from fastapi import FastAPI  # noqa: E402

from idempotency_async.integrations.fastapi import (  # noqa: E402
    IdempotencyKey,
    OptionalIdempotencyKey,
)
from idempotency_async.integrations.starlette import IdempotencyMiddleware  # noqa: E402

api = FastAPI()


async def required_key(key: IdempotencyKey) -> None:
    assert_type(key, str)


async def optional_key(key: OptionalIdempotencyKey) -> None:
    assert_type(key, str | None)


IdempotencyMiddleware(api, manager=manager, wait=Wait(timeout=5.0))
IdempotencyMiddleware(api, manager=manager, wait=False)
IdempotencyMiddleware(api, manager=manager, wait=5.0)  # type: ignore[arg-type]
IdempotencyMiddleware(api, manager=manager, wait=True)  # type: ignore[arg-type]
Options(renewal=Renewal(lease=30.0, every=10.0), wait=Wait(timeout=10.0))
Options(local_cache=LocalCache(max_items=1000), renewal=None, wait=None)
Options(wait=True)  # type: ignore[arg-type]
Options(renew_lease=30.0)  # type: ignore[call-arg]
assert_type(Options().renewal, Renewal | None)
assert_type(Wait().timeout, float)


def telemetry_is_an_instrumentation() -> None:
    from idempotency_async.instrumentation import Instrumentation
    from idempotency_async.otel import Telemetry

    instrumentation: Instrumentation = Telemetry()
    Options(telemetry=instrumentation)
    Options(telemetry=Telemetry())
    Options(telemetry="otel")  # type: ignore[arg-type]


def conformance_kit() -> None:
    from idempotency_async.testing import SimulationReport, StoreContract, simulate

    assert_type(simulate(MemoryStore, range(10)), SimulationReport)
    simulate(MemoryStore, seeds=["a"])  # type: ignore[list-item]
    assert_type(StoreContract, type[StoreContract])


async def transactional_calls(pool: Any, engine: AsyncEngine, session: AsyncSession) -> None:
    from idempotency_async.stores.postgres import retry_transaction

    async def pay() -> int:
        return 1

    async with pool.acquire() as connection:  # asyncpg (untyped): accepted
        assert_type(await manager.execute_in_transaction(connection, {"id": 1}, pay), int)
    assert_type(await manager.execute_in_transaction(session, {"id": 1}, pay), int)
    await manager.execute_in_transaction(engine, {"id": 1}, pay)  # type: ignore[arg-type]

    async def answers(call: Call) -> str:
        call.release("a server error")
        return "503"

    keyed = manager.keyed({"id": 1})
    assert_type(keyed.key, str | None)
    assert_type(await keyed.execute_call_in_transaction(session, answers), str)
    await keyed.execute_call_in_transaction(session, pay)  # type: ignore[arg-type]

    async def work(s: AsyncSession) -> str:
        return "done"

    assert_type(await retry_transaction(session, work, isolation="serializable"), str)
    await retry_transaction(session, work, isolation="snapshot")  # type: ignore[arg-type]


def redaction() -> None:
    from idempotency_async import Redaction

    declared = Redaction(fields=("credentials.secret", "items[*].token"))
    assert_type(declared.apply({"a": 1}), tuple[Any, tuple[str, ...]])
    Options(redaction=Redaction(never_store=True))
    Options(redaction=("a.b",))  # type: ignore[arg-type]


class Declined(Exception):
    pass


@idempotent_function(manager, payload="order", replay_errors=(Declined,))
async def decline(order: str) -> int:
    raise Declined(order)


def declared_errors() -> None:
    Options(replay_errors=(Declined, ValueError))
    Options(replay_errors=ReplayErrors((Declined,), data=lambda exc: str(exc), max_bytes=512))
    Options(replay_errors=Declined)
    Options(replay_errors=(int,))  # type: ignore[arg-type]
    assert_type(decline("o-1"), Awaitable[int])
    error = errors.ReplayedError("x", key="k", error_type="m:C", error_message="x", data=None)
    assert_type(error.error_type, str)
