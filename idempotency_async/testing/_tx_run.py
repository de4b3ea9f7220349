"""Running one transactional scenario on a real Postgres: tables of its own, each call in
its own transaction on its own connection, and what committed read back afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.errors import AlreadyInProgressError, DeadlineExceededError
from idempotency_async.manager import Manager
from idempotency_async.options import Options
from idempotency_async.stores.postgres import PostgresStore, create_table
from idempotency_async.testing._run import quiet_library
from idempotency_async.testing._tx_scenario import TxCallPlan, TxScenario

__all__ = [
    "CALLER_LOCK_TIMEOUT",
    "TxCallbackFailed",
    "TxOutcome",
    "TxTrace",
    "run_transactional",
]

_MISSING: Any = object()
CALLER_LOCK_TIMEOUT = "7s"
"""The ``lock_timeout`` every simulated caller sets in its transaction before the call."""


class TxCallbackFailed(Exception):
    """What a simulated transactional callback raises on purpose."""


@dataclass(slots=True)
class TxOutcome:
    """What one caller did and got."""

    call: int
    writer: str
    """The callback's result, and the ``writer`` of its effect row."""
    began: float
    entered: float | None = None
    exited: float | None = None
    value: Any = _MISSING
    error: BaseException | None = None
    ran: bool = False
    returned: bool = False
    raised: BaseException | None = None
    """What the callback raised: its own exception, or its own statement's failure."""
    cancel_requested: bool = False
    committed: bool | None = False
    """``True``: COMMIT answered; ``False``: rolled back or never sent; ``None``: COMMIT
    sent and the connection lost before its answer (either may have happened)."""
    commit_error: str | None = None
    commit_state: str | None = None
    lock_timeout: str | None = None
    """The transaction's ``lock_timeout`` after the call (the caller set ``CALLER_LOCK_TIMEOUT``),
    read when the call left the transaction usable."""
    """The SQLSTATE of a refused COMMIT (40001: a serialization failure)."""

    @property
    def returned_value(self) -> bool:
        return self.value is not _MISSING


@dataclass(slots=True)
class TxTrace:
    """A transactional scenario's outcomes, and the tables it left."""

    scenario: TxScenario
    outcomes: list[TxOutcome]
    records: list[tuple[str, str, str | None]] = field(default_factory=list)
    """Every record row: (key, status, response as JSON text)."""
    effects: list[tuple[int, str]] = field(default_factory=list)
    """Every committed effect row: (the scenario's key index, writer)."""
    attempts: set[str] = field(default_factory=set)
    """The writers whose own write before the call committed."""
    unfinished: list[int] = field(default_factory=list)


# The errors after which the caller's transaction is still usable: only the library's
# savepoint was rolled back, and the caller commits its own writes.
_USABLE = (TxCallbackFailed, AlreadyInProgressError, DeadlineExceededError)


async def run_transactional(
    scenario: TxScenario, pool: Any, connect: Any, *, stuck_after: float = 60.0
) -> TxTrace:
    """Run ``scenario`` with an asyncpg ``pool`` (a connection per call) and ``connect``
    (an async callable opening a connection outside the pool, to kill backends)."""
    name = f"idem_tx_{secrets.token_hex(6)}"
    effects, attempts, deferred = f'"{name}_e"', f'"{name}_a"', f'"{name}_d"'
    await create_table(pool, table=name)
    await pool.execute(f"CREATE TABLE {effects} (key int NOT NULL, writer text NOT NULL)")
    await pool.execute(f"CREATE TABLE {attempts} (writer text NOT NULL)")
    await pool.execute(f"CREATE TABLE {deferred} (v text UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    store = PostgresStore(pool, table=name)
    managers = [
        Manager(
            store,
            Options(
                key_prefix=f"tx{scenario.seed}",
                event_key_jmespath="id",
                wait=plan.wait,
                wait_timeout=plan.wait_timeout,
                use_local_cache=plan.use_local_cache,
            ),
        )
        for plan in scenario.managers
    ]
    killer = await connect()
    killing = asyncio.Lock()
    dropped: list[int] = []  # backends whose client went away: they may still be finishing
    loop = asyncio.get_running_loop()
    start = loop.time()
    trace = TxTrace(scenario, [TxOutcome(i, f"c{i}", 0.0) for i in range(len(scenario.calls))])

    async def drive(index: int, plan: TxCallPlan) -> None:
        outcome = trace.outcomes[index]
        await asyncio.sleep(max(0.0, start + plan.at - loop.time()))
        outcome.began = loop.time()
        connection = await pool.acquire()
        try:
            await _transaction(index, plan, outcome, connection)
        finally:
            try:
                await pool.release(connection)
            except Exception:
                connection.terminate()

    async def _transaction(
        index: int, plan: TxCallPlan, outcome: TxOutcome, connection: Any
    ) -> None:
        transaction = connection.transaction(isolation=plan.isolation)
        await transaction.start()
        if plan.early_snapshot:
            await connection.fetchval("SELECT 1")
        await connection.execute(f"INSERT INTO {attempts} VALUES ($1)", outcome.writer)
        await connection.execute(f"SET LOCAL lock_timeout = '{CALLER_LOCK_TIMEOUT}'")
        if plan.fault == "commit_fails":
            await connection.execute(f"INSERT INTO {deferred} VALUES ('x'), ('x')")

        async def callback() -> str:
            outcome.ran = True
            try:
                await connection.execute(
                    f"INSERT INTO {effects} VALUES ($1, $2)", plan.key, outcome.writer
                )
                if plan.fault == "kill_backend":
                    async with killing:
                        await killer.execute(
                            "SELECT pg_terminate_backend($1)", connection.get_server_pid()
                        )
                await asyncio.sleep(3600.0 if plan.behaviour == "hang" else plan.duration)
                if plan.behaviour == "raise":
                    raise TxCallbackFailed(outcome.writer)
            except Exception as exc:
                outcome.raised = exc
                raise
            outcome.returned = True
            return outcome.writer

        outcome.entered = loop.time()
        call = asyncio.create_task(
            managers[plan.manager].execute_in_transaction(
                connection, {"id": plan.key}, callback, timeout=plan.timeout
            )
        )

        def cancel() -> None:
            if not call.done():
                outcome.cancel_requested = True
                call.cancel()

        timer = loop.call_later(plan.fault_after, cancel) if plan.fault == "cancel" else None
        try:
            outcome.value = await call
        except BaseException as exc:  # the outcome is the subject under test
            outcome.error = exc
        finally:
            outcome.exited = loop.time()
            if timer is not None:
                timer.cancel()
        if _gone(connection):
            return
        spoiled = outcome.error is not None and not isinstance(outcome.error, _USABLE)
        if spoiled or plan.fault in ("rollback_after_return", "cancel"):
            try:
                await transaction.rollback()
            except Exception:
                connection.terminate()
            return
        try:
            outcome.lock_timeout = await connection.fetchval("SHOW lock_timeout")
        except Exception as exc:
            outcome.lock_timeout = f"unreadable: {exc!r}"
        await asyncio.sleep(plan.hold)
        if plan.fault in ("close_socket", "commit_unanswered"):
            dropped.append(connection.get_server_pid())
        if plan.fault == "close_socket":
            connection.terminate()
            return
        if plan.fault == "commit_unanswered":
            commit = asyncio.create_task(connection.execute("COMMIT"))
            await asyncio.sleep(0)  # the COMMIT is on the wire; its answer is not read
            connection.terminate()
            try:
                await commit
                outcome.committed = True
            except Exception:
                outcome.committed = None
            return
        try:
            await transaction.commit()
            outcome.committed = True
        except Exception as exc:
            outcome.commit_error = f"{type(exc).__name__}: {exc}"
            outcome.commit_state = getattr(exc, "sqlstate", None)
            with contextlib.suppress(Exception):
                await transaction.rollback()

    tasks: list[asyncio.Task[None]] = []
    try:
        with quiet_library():
            tasks += [
                asyncio.create_task(drive(index, plan)) for index, plan in enumerate(scenario.calls)
            ]
            _, pending = await asyncio.wait(tasks, timeout=stuck_after)
            trace.unfinished = [tasks.index(task) for task in pending]
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"call {tasks.index(task)}'s harness failed") from (
                        task.exception()
                    )
        await _gone_from_the_server(killer, dropped)
        async with pool.acquire() as reader, reader.transaction(isolation="repeatable_read"):
            rows = await reader.fetch(f'SELECT key, status, response::text FROM "{name}"')
            trace.records = [(row[0], row[1], row[2]) for row in rows]
            rows = await reader.fetch(f"SELECT * FROM {effects}")
            trace.effects = [(row[0], row[1]) for row in rows]
            trace.attempts = {row[0] for row in await reader.fetch(f"SELECT * FROM {attempts}")}
    finally:
        # Nothing of the scenario outlives it (this run may itself be cancelled).
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await killer.close()
        for table in (f'"{name}"', effects, attempts, deferred):
            with contextlib.suppress(Exception):
                await pool.execute(f"DROP TABLE IF EXISTS {table}")
    return trace


def _gone(connection: Any) -> bool:
    """Whether the connection was closed or terminated (a pool's proxy of a terminated
    connection refuses every method, this one too)."""
    try:
        return bool(connection.is_closed())
    except Exception:
        return True


async def _gone_from_the_server(observer: Any, pids: list[int], seconds: float = 30.0) -> None:
    """Wait until the backends of dropped connections ended: a COMMIT whose client went
    away may still be applying when the client moved on."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    while pids and loop.time() < give_up:
        alive = await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids
        )
        if alive == 0:
            return
        await asyncio.sleep(0.01)
