"""A store wrapper that times each round trip: a span event on the call span and a
histogram sample.  No span of its own, so a driver's instrumentation (botocore, redis)
nests its client span directly under the call span instead of under a duplicate."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from idempotency_async.errors import ConfigError
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import (
    Extended,
    Stepped,
    StepTransaction,
    StepWrite,
    Store,
    Verdict,
    Written,
)

__all__ = ["ObservedStore", "RoundTripObserver", "system_of"]

T = TypeVar("T")

_SYSTEMS = {"DynamoDBStore": "aws.dynamodb", "RedisStore": "redis", "MemoryStore": "memory"}


def system_of(store: Store) -> str:
    """``db.system.name`` of a store: its ``db_system_name`` attribute, else by class."""
    declared = getattr(store, "db_system_name", None)
    if isinstance(declared, str):
        return declared
    name = type(store).__name__
    return _SYSTEMS.get(name, name)


class RoundTripObserver(Protocol):
    """Who the wrapper reports each round trip to (the manager's bound telemetry)."""

    def active(self) -> bool: ...

    def store_round_trip(
        self,
        operation: str,
        key: str,
        seconds: float,
        started_ns: int,
        result: str | None,
        failure: BaseException | None,
    ) -> None: ...


class ObservedStore:
    """Implements the store protocol over ``inner`` for one manager with telemetry (chosen
    when the manager is built): round trips are timed while calls are observed."""

    def __init__(self, inner: Store, bound: RoundTripObserver) -> None:
        self.inner = inner
        self._bound = bound
        self.max_response_bytes = inner.max_response_bytes

    async def claim(self, claim: Claim) -> Verdict:
        return await self._timed("claim", claim.key, self.inner.claim(claim))

    async def get(self, key: str, *, now: float) -> Verdict:
        return await self._timed("get", key, self.inner.get(key, now=now))

    async def complete(self, completion: Completion) -> Written:
        return await self._timed("complete", completion.key, self.inner.complete(completion))

    async def release(self, key: str, owner: str) -> bool:
        return await self._timed("release", key, self.inner.release(key, owner))

    async def extend(self, claim: Claim) -> Extended:
        return await self._timed("extend", claim.key, self.inner.extend(claim))

    async def force_release(self, key: str) -> Record | None:
        return await self._timed("force_release", key, self.inner.force_release(key))

    async def record_step(self, write: StepWrite) -> Stepped:
        # Called only when the inner store records steps (the manager checks it).
        inner = self.inner.record_step(write)  # type: ignore[attr-defined]
        return await self._timed("record_step", write.key, inner)

    async def begin_step(self, connection: Any) -> StepTransaction:
        begin = getattr(self.inner, "begin_step", None)
        if begin is None:
            raise ConfigError(
                "step(..., connection=...) is a transactional step, which needs a "
                f"PostgresStore; this call's store is {type(self.inner).__name__}"
            )
        transaction: StepTransaction = await begin(connection)
        return _ObservedStep(self, transaction)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def _timed(self, operation: str, key: str, round_trip: Awaitable[T]) -> T:
        bound = self._bound
        if not bound.active():
            return await round_trip
        started_ns = time.time_ns()
        started = time.perf_counter()
        try:
            result = await round_trip
        except BaseException as exc:
            seconds = time.perf_counter() - started
            bound.store_round_trip(operation, key, seconds, started_ns, None, exc)
            raise
        seconds = time.perf_counter() - started
        bound.store_round_trip(operation, key, seconds, started_ns, _describe(result), None)
        return result


class _ObservedStep:
    """A transactional step's transaction whose recovery point is timed as a round trip."""

    def __init__(self, store: ObservedStore, inner: StepTransaction) -> None:
        self._store = store
        self._inner = inner

    async def record(self, write: StepWrite) -> Stepped:
        return await self._store._timed("record_step", write.key, self._inner.record(write))

    async def rollback(self) -> None:
        await self._inner.rollback()


def _describe(result: object) -> str | None:
    """``idempotency.store.result``: what the store answered, in one word."""
    if isinstance(result, Verdict):
        return str(result.found.value)
    if isinstance(result, (Written, Stepped)):
        return str(result.value)
    if isinstance(result, bool):
        return "released" if result else "not_owner"
    if isinstance(result, Record):
        return "deleted"
    return None
