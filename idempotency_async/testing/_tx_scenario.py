"""Scenarios of transactional calls (``Manager.execute_in_transaction`` on Postgres).

A scenario is a plain value generated from a seed, like the lease-mode simulator's: a few
managers sharing one table, a few calls over one or two keys, each in its own transaction
on its own connection, with the faults a transaction can meet — the callback raising or
cut off, the caller rolling back after the call returned, COMMIT failing or never
answered, the connection killed mid-transaction, duplicates blocked on the row past a
short lock timeout, the caller cancelled, snapshot isolation levels — and the misuse a
caller can make of one: committing after a handled timeout, a callback that commits or
leaves a savepoint of the library's old name, a rollback to a savepoint taken before the
call, a second call in the same transaction (same key or another), a session bound to two
engines; beside them, lease-mode callers on the same keys and a migration holding the
table locked past the calls' deadlines.  Times are seconds times ``scale``.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = [
    "MISUSE",
    "Driver",
    "Isolation",
    "TxBehaviour",
    "TxCallPlan",
    "TxFault",
    "TxManagerPlan",
    "TxScenario",
    "Mode",
    "generate_transactional",
    "simpler_transactional",
]

Isolation = Literal["read_committed", "repeatable_read", "serializable"]
TxBehaviour = Literal["return", "raise", "hang"]
Driver = Literal["asyncpg", "psycopg", "two_engines"]
"""``two_engines``: a SQLAlchemy session bound to two engines (refused before any
statement)."""
TxFault = Literal[
    "none",
    "rollback_after_return",  # the call returned; the caller rolls back
    "commit_fails",  # COMMIT fails (a deferred constraint the caller broke)
    "commit_unanswered",  # COMMIT sent, the connection dropped before its answer
    "kill_backend",  # pg_terminate_backend from another connection, in the callback
    "close_socket",  # the client drops the connection after the call, before COMMIT
    "cancel",  # the caller's task is cancelled fault_after seconds into the call
    # Misuse:
    "commit_after_timeout",  # the caller's own timeout (fault_after) fires; it commits
    "callback_commits",  # the callback sends COMMIT after its effect
    "old_savepoint",  # the callback opens SAVEPOINT idempotency_async, then raises
    "caller_savepoint",  # SAVEPOINT before the call, ROLLBACK TO it after; then COMMIT
    "again_same_key",  # a second call of the same key in the same transaction
    "again_other_key",  # a second call of a key of its own in the same transaction
]
Mode = Literal["transaction", "lease"]
FAULTS: tuple[TxFault, ...] = (
    "rollback_after_return",
    "commit_fails",
    "commit_unanswered",
    "kill_backend",
    "close_socket",
    "cancel",
)
MISUSE: tuple[TxFault, ...] = (
    "commit_after_timeout",
    "callback_commits",
    "old_savepoint",
    "caller_savepoint",
    "again_same_key",
    "again_other_key",
)

_ISOLATIONS: tuple[Isolation, ...] = ("read_committed", "repeatable_read", "serializable")
_BEHAVIOURS: tuple[TxBehaviour, ...] = ("return", "raise", "hang")


@dataclass(frozen=True, slots=True)
class TxManagerPlan:
    """One process's manager: ``wait`` on or off and its lock wait bound (stored flat, as
    JSON: ``Options(wait=Wait(timeout=wait_timeout))`` when ``wait``)."""

    wait: bool
    wait_timeout: float
    use_local_cache: bool = False
    """A transactional call neither reads nor fills the cache: a later call may."""


@dataclass(frozen=True, slots=True)
class TxCallPlan:
    """One transactional call and the transaction around it."""

    manager: int
    key: int
    at: float
    """When the caller begins its transaction (seconds from the scenario's start)."""
    isolation: Isolation
    early_snapshot: bool
    """The snapshot is taken when the transaction begins (before the call), not by the
    claim: a record committed in between is invisible to it."""
    behaviour: TxBehaviour
    duration: float
    """How long the callback works (after its effect write) before it returns or raises."""
    hold: float
    """How long the caller keeps its transaction open after the call, before COMMIT:
    duplicates stay blocked on the row meanwhile."""
    timeout: float | None
    fault: TxFault = "none"
    fault_after: float = 0.0
    """``cancel``: seconds after the call started."""
    driver: Driver = "asyncpg"
    """The caller's connection: asyncpg's, or psycopg 3's (``AsyncConnection``)."""
    mode: Mode = "transaction"
    """``lease``: a lease-mode call (``Manager.execute``) of the same key, whose callback
    writes its effect in a statement of its own (no transaction of the caller's)."""


@dataclass(frozen=True, slots=True)
class TxScenario:
    seed: int
    managers: tuple[TxManagerPlan, ...]
    calls: tuple[TxCallPlan, ...]
    scale: float = 1.0
    table_lock: tuple[float, float] | None = None
    """(when, for how long): a migration holds ACCESS EXCLUSIVE on the record table."""

    def describe(self) -> str:
        """The scenario as readable text (printed with every failure)."""
        lines = [f"transactional scenario seed={self.seed} scale={self.scale}"]
        if self.table_lock is not None:
            lines.append(f"  table locked at {self.table_lock[0]} for {self.table_lock[1]} s")
        lines += [f"  manager {index}: {plan}" for index, plan in enumerate(self.managers)]
        lines += [f"  call {index}: {call}" for index, call in enumerate(self.calls)]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TxScenario:
        data: dict[str, Any] = json.loads(text)
        managers = tuple(TxManagerPlan(**plan) for plan in data.pop("managers"))
        calls = tuple(TxCallPlan(**plan) for plan in data.pop("calls"))
        lock = data.pop("table_lock", None)
        return cls(
            managers=managers,
            calls=calls,
            table_lock=None if lock is None else (lock[0], lock[1]),
            **data,
        )


def _s(rng: random.Random, low: float, high: float, scale: float) -> float:
    return round(rng.uniform(low, high) * scale, 3)


def generate_transactional(seed: int, *, scale: float = 1.0) -> TxScenario:
    """The transactional scenario of ``seed``: 2-3 managers, 3-8 calls over 1-2 keys.

    Half the calls carry a fault; a third of the transactions run under REPEATABLE READ
    or SERIALIZABLE; calls of one key overlap, so duplicates meet the row locked.
    """
    rng = random.Random(f"tx-{seed}")
    managers = tuple(
        TxManagerPlan(
            wait=rng.random() < 0.6,
            wait_timeout=_s(rng, 0.02, 0.4, scale) if rng.random() < 0.6 else 5.0 * scale,
            use_local_cache=rng.random() < 0.5,
        )
        for _ in range(rng.randint(2, 3))
    )
    keys = rng.randint(1, 2)
    calls = []
    for _ in range(rng.randint(3, 8)):
        isolation = rng.choices(_ISOLATIONS, [4, 1, 1])[0]
        behaviour = rng.choices(_BEHAVIOURS, [6, 2, 1])[0]
        timeout = _s(rng, 0.05, 0.6, scale) if rng.random() < 0.5 else None
        if behaviour == "hang" and timeout is None:
            timeout = _s(rng, 0.05, 0.3, scale)
        fault: TxFault = rng.choice(FAULTS) if rng.random() < 0.5 else "none"
        calls.append(
            TxCallPlan(
                manager=rng.randrange(len(managers)),
                key=rng.randrange(keys),
                at=_s(rng, 0.0, 0.3, scale),
                isolation=isolation,
                early_snapshot=isolation != "read_committed" and rng.random() < 0.7,
                behaviour=behaviour,
                duration=_s(rng, 0.0, 0.1, scale),
                hold=_s(rng, 0.0, 0.2, scale) if rng.random() < 0.5 else 0.0,
                timeout=timeout,
                fault=fault,
                fault_after=_s(rng, 0.0, 0.15, scale),
            )
        )
    # Drawn from a stream of its own, so the other draws of a seed stay as they were.
    drivers = random.Random(f"tx-driver-{seed}")
    calls = [
        replace(call, driver="psycopg")
        if drivers.random() < 0.3 and call.fault != "commit_unanswered"
        else call
        for call in calls
    ]
    calls, table_lock = _misuse(seed, calls, scale)
    calls.sort(key=lambda call: call.at)
    return TxScenario(seed, managers, tuple(calls), scale, table_lock)


def _misuse(
    seed: int, calls: list[TxCallPlan], scale: float
) -> tuple[list[TxCallPlan], tuple[float, float] | None]:
    """Misuse, lease-mode neighbours and a migration's table lock, drawn from a stream of
    their own (the other draws of a seed stay as they were)."""
    rng = random.Random(f"tx-misuse-{seed}")
    changed = []
    for call in calls:
        draw = rng.random()
        if draw < 0.15 and call.fault == "none":
            fault = rng.choice(MISUSE)
            call = replace(call, fault=fault)
            if fault == "commit_after_timeout":
                # The caller's own timeout, shorter than the work: it fires mid-callback.
                call = replace(call, behaviour="hang", fault_after=_s(rng, 0.02, 0.1, scale))
            elif fault == "old_savepoint":
                call = replace(call, behaviour="raise")
        elif draw < 0.27:
            # A lease-mode call of the same key: it returns (its effect is one autocommit
            # statement, written last), with no deadline to cut it.
            call = replace(
                call,
                mode="lease",
                behaviour="return",
                timeout=None,
                fault="none",
                isolation="read_committed",
                early_snapshot=False,
                driver="asyncpg",
            )
        elif draw < 0.3:
            call = replace(call, driver="two_engines", fault="none")
        changed.append(call)
    table_lock = None
    if rng.random() < 0.15:
        table_lock = (_s(rng, 0.0, 0.3, scale), _s(rng, 0.2, 0.5, scale))
    return changed, table_lock


def simpler_transactional(scenario: TxScenario) -> Iterator[TxScenario]:
    """Candidates one step simpler than ``scenario``, for shrinking: a call fewer, an
    unused manager fewer, then one field of one call or manager made plain."""
    calls = scenario.calls
    if scenario.table_lock is not None:
        yield replace(scenario, table_lock=None)
    for index in reversed(range(len(calls))):
        if len(calls) > 1:
            yield replace(scenario, calls=calls[:index] + calls[index + 1 :])
    used = {call.manager for call in calls}
    for manager in reversed(range(len(scenario.managers))):
        if manager not in used and len(scenario.managers) > 1:
            managers = scenario.managers[:manager] + scenario.managers[manager + 1 :]
            moved = tuple(
                replace(call, manager=call.manager - 1) if call.manager > manager else call
                for call in calls
            )
            yield replace(scenario, managers=managers, calls=moved)
    plain: list[dict[str, Any]] = [
        {"mode": "transaction"},
        {"fault": "none"},
        {"behaviour": "return"},
        {"isolation": "read_committed", "early_snapshot": False},
        {"early_snapshot": False},
        {"hold": 0.0},
        {"duration": 0.0},
        {"timeout": None},
        {"at": 0.0},
        {"key": 0},
        {"driver": "asyncpg"},
    ]
    for index, call in enumerate(calls):
        for change in plain:
            candidate = replace(call, **change)
            if candidate.behaviour == "hang" and candidate.timeout is None:
                continue
            if candidate != call:
                yield replace(scenario, calls=(*calls[:index], candidate, *calls[index + 1 :]))
    for index, plan in enumerate(scenario.managers):
        plain_managers: list[dict[str, Any]] = [
            {"wait": False},
            {"wait_timeout": 5.0 * scenario.scale},
            {"use_local_cache": False},
        ]
        for change in plain_managers:
            simpler = replace(plan, **change)
            if simpler != plan:
                managers = (*scenario.managers[:index], simpler, *scenario.managers[index + 1 :])
                yield replace(scenario, managers=managers)
