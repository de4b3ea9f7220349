"""The Postgres store inside a caller's transaction (``Manager.execute_in_transaction``).

Every statement runs on the caller's connection, in the caller's transaction, which the
library never commits nor rolls back.  A first call is, counting the caller's ``BEGIN``
and ``COMMIT``: ``BEGIN``; the claim (one prepared call of the table's claim function,
which reads the row first and answers a replay from it); ``SAVEPOINT`` (the callback's
writes are undone with it if the callback fails); the callback's statements; the
owner-fenced completion; ``COMMIT`` — and a replay is ``BEGIN``, the claim, ``COMMIT``.

The claim is written before the savepoint, so undoing a failed call is the savepoint's
rollback plus the claim's deletion, in one round trip; the row stays locked until the
caller's transaction ends (waiting duplicates then find it gone, and run).  The savepoint
is not released after the completion: ``COMMIT`` commits it with the rest, and a release
would cost a round trip.  A claim left unfinished (the caller was cancelled, or committed
from inside the callback) cannot commit: the table's guard refuses the ``COMMIT``
(``_postgres_schema``).

Every statement is bounded by the call's deadline: the claim's lock waits on the server
(its ``lock_timeout``, for the row and the table), and each statement by the driver, which
cancels it at the deadline.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Final

from idempotency_async.errors import (
    ConfigError,
    DeadlineExceededError,
    DeadlockDetectedError,
    LockTimeoutError,
    SerializationFailureError,
    StoreUnavailableError,
)
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores._postgres_connections import Driver, Session
from idempotency_async.stores._postgres_errors import translated
from idempotency_async.stores._postgres_schema import Schema, response_bound, undo
from idempotency_async.stores._postgres_sql import lock_wait
from idempotency_async.stores._postgres_values import (
    check_key,
    completion_text,
    record_from_row,
    text_column,
)
from idempotency_async.stores.base import CLAIMED, Extended, Found, Verdict, Written, judge

__all__ = ["TransactionStore"]

_ANSWERED: Final = 12  # the claim function's columns
_CLEANUP: Final = 0.5  # seconds a statement after the deadline may take (the savepoint, an undo)


class TransactionStore:
    """The record store's operations for one transactional call, on the caller's
    connection: :meth:`claim_within` claims (and opens the call's savepoint),
    :meth:`complete` completes, :meth:`release` undoes the call."""

    db_system_name: Final = "postgresql"
    reads_bounded: Final = True
    """Its reads end a wait on the server (a lock timeout), not by a cancellation: a
    cancellation could land on the caller's next statement and abort its transaction."""

    def __init__(
        self,
        connection: Driver,
        schema: Schema,
        table: str,
        limit: int,
        session: Session | None = None,
    ) -> None:
        self._connection = connection
        self._session = session
        self._schema = schema
        self.table = table
        self.max_response_bytes = limit
        self._read_bound = response_bound(limit)
        self._owner: str | None = None  # the claim this call holds, until undone
        self._savepoint: str | None = None
        self._deadline = self._wait_until = 0.0  # loop times, set by the claim

    @property
    def table_name(self) -> str:
        return self.table

    async def claim_within(self, claim: Claim, wait: float) -> Verdict:
        """Claim the key, waiting at most ``wait`` seconds for a lock another transaction
        holds (the key's row, or the table), then :class:`LockTimeoutError`."""
        key = claim.key
        now = asyncio.get_running_loop().time()
        self._deadline = now + claim.lease
        self._wait_until = now + wait
        # The claim function ends its own lock waits by ``wait`` (the server's bound); the
        # driver's cancellation is the backstop, later, so that it never races the answer
        # (a cancel landing on the next statement would abort the caller's transaction).
        left = _left(self._deadline, key) + _CLEANUP
        try:
            row = await self._fetchrow(
                "claim",
                key,
                left,
                self._schema.claim,
                key,
                claim.owner,
                float(claim.ttl),
                claim.validation,
                lock_wait(wait),
                self._read_bound,
            )
        except DeadlineExceededError as exc:
            await self._abandoned(key, claim.owner, exc)  # the claim may have applied
            raise
        answer = row[0] if row is not None and len(row) == _ANSWERED else None
        if answer == "claimed":
            check_key(key, row[11])  # (the claim applied: the guard refuses the COMMIT)
            self._owner = claim.owner
            savepoint = "idempotency_async_" + "".join(
                c if c.isalnum() else "_" for c in claim.owner
            )
            try:
                # Not cut at the deadline: a claim answered late is undone by the lifecycle
                # ("claimed too late to run"), which needs the savepoint's state known.
                await self._script("claim", key, f"SAVEPOINT {savepoint}", _CLEANUP)
            except Exception as exc:
                await self._abandoned(key, claim.owner, exc)
                raise
            self._savepoint = savepoint
            if self._session is not None:
                self._session.remember()
            if row[8] is None:
                return CLAIMED
            # It took over a row carrying recovery points of its own payload: they resume.
            kept = claim.to_record(row[9])._replace(lease_end=-math.inf, steps=row[8])
            return Verdict(Found.CLAIMED, kept)
        if answer == "resumable":
            check_key(key, row[11])
            return Verdict(Found.RESUMABLE, record_from_row(key, row[1:9], self.max_response_bytes))
        if answer == "read":
            check_key(key, row[11])
            verdict = judge(record_from_row(key, row[1:9], self.max_response_bytes), row[9])
            if verdict.found is Found.IN_PROGRESS and row[10] and wait > 0:
                # A lease-mode call holds the key: this transaction's snapshot will never see
                # it complete, so waiting could only time out.
                raise SerializationFailureError(
                    f"key {key} is held by a lease-mode call (execute), whose completion this "
                    "transaction cannot see under REPEATABLE READ or SERIALIZABLE: roll the "
                    "transaction back and run it again (a new snapshot sees the result)",
                    key=key,
                    sqlstate="40001",
                )
            return verdict
        if answer == "mine":
            raise ConfigError(
                f"this transaction already holds key {key} from a call that did not finish "
                "(it was cancelled or timed out, and the transaction went on): roll the "
                "transaction back; it cannot commit"
            )
        raise _caught(answer, row[7] if row is not None and len(row) > 7 else None, key)

    async def claim(self, claim: Claim) -> Verdict:
        return await self.claim_within(claim, 0.0)

    async def get(self, key: str, *, now: float) -> Verdict:
        """Read the key's row (a duplicate polling a lease-mode holder), through the claim
        function: its lock waits end with the call's wait, on the server, and a
        cancellation rolls back only the function's subtransaction."""
        now = asyncio.get_running_loop().time()
        row = await self._fetchrow(
            "get",
            key,
            max(self._deadline - now, 0.0) + _CLEANUP,  # the backstop, as for the claim
            self._schema.claim,
            key,
            None,
            0.0,
            None,
            lock_wait(max(self._wait_until - now, 0.0)),  # the server's bound: the wait's end
            self._read_bound,
        )
        if row is None or len(row) != _ANSWERED or row[0] != "read":
            raise _caught(row[0] if row else None, row[7] if row else None, key, "get")
        if row[1] is None:
            return judge(None, row[9])
        check_key(key, row[11])
        return judge(record_from_row(key, row[1:9], self.max_response_bytes), row[9])

    async def complete(self, completion: Completion) -> Written:
        """The owner-fenced completion.  A failure leaves the caller's transaction aborted:
        it can only roll back (nothing commits)."""
        key = completion.key
        text, reason = completion_text(completion, self.max_response_bytes)
        row = await self._fetchrow(
            "complete",
            key,
            None,  # bounded by the lifecycle, at the lease end
            self._schema.complete,
            key,
            completion.owner,
            float(completion.ttl),
            completion.validation,
            text,
            None if text is not None else text_column(reason),
        )
        self._owner = None
        if not row or row[0] is None:
            return Written.NOTHING
        if row[0] is False:
            return Written.RESPONSE  # the owner's response, kept: it is final
        return Written.WITHOUT_RESPONSE if text is None else Written.RESPONSE

    async def release(self, key: str, owner: str) -> bool:
        """Undo the call: its savepoint's rollback (the callback's writes go) and its
        claim's deletion.  Nothing to undo when the caller's transaction already ended
        inside the callback (it committed — refused by the table's guard — or rolled
        back): nothing of the call can commit."""
        if self._owner is None:
            return True
        if self._connection.in_transaction():
            await self._script("release", key, undo(self.table, self._savepoint, key, owner))
        self._owner = self._savepoint = None
        if self._session is not None:
            self._session.forget_callback()
        return True

    async def extend(self, claim: Claim) -> Extended:
        # The row lock holds the key until the transaction ends: no lease to move.
        return Extended.RENEWED

    async def force_release(self, key: str) -> Record | None:
        raise ConfigError("force_release is not part of a transactional call")

    async def aclose(self) -> None:
        return None

    async def _abandoned(self, key: str, owner: str, error: BaseException) -> None:
        """Undo a claim that may have applied but will not run (its answer came after the
        deadline, or its savepoint failed), so that the caller's transaction can go on; a
        failure is a note on ``error`` — roll back (a COMMIT would be refused)."""
        if not self._connection.in_transaction():
            return
        try:
            await self._connection.script(undo(self.table, None, key, owner), timeout=_CLEANUP)
        except Exception as exc:
            error.add_note(
                f"idempotency-async: the claim of key {key} may have applied and could not be "
                f"undone ({exc!r}): roll the transaction back (its COMMIT would be refused)"
            )
        else:
            self._owner = None

    async def _fetchrow(
        self, operation: str, key: str, timeout: float | None, sql: str, *args: Any
    ) -> Any:
        try:
            return await self._connection.fetchrow(sql, *args, timeout=timeout)
        except Exception as exc:
            error = self._error(exc, operation, key)
            if error is exc:
                raise
            raise error from exc

    async def _script(
        self, operation: str, key: str, sql: str, timeout: float | None = None
    ) -> None:
        try:
            await self._connection.script(sql, timeout=timeout)
        except Exception as exc:
            error = self._error(exc, operation, key)
            if error is exc:
                raise
            raise error from exc

    def _error(self, exc: Exception, operation: str, key: str) -> Exception:
        if isinstance(exc, TimeoutError) and not isinstance(exc, DeadlineExceededError):
            return DeadlineExceededError(
                f"the transactional {operation} of key {key} got no answer before the call's "
                "deadline (a slow server, or a lock the driver waited for): it was cancelled "
                "and may have applied; roll the transaction back (it cannot commit a claim "
                "left unfinished)",
                key=key,
            )
        state = getattr(exc, "sqlstate", None)
        if state in ("55P03", "40001", "40P01", "57014"):
            return _caught(state, str(exc), key, operation)
        if state == "42883":  # undefined function: the table was not migrated
            return ConfigError(
                f"the transactional {operation} of key {key} failed ({exc}): the table "
                f"{self.table} lacks what transactional calls need; run `idempotency-async "
                "migrate` (docs/postgres.md)"
            )
        return translated(exc, f"transactional {operation}", key, self.table)


def _left(ends: float, key: str) -> float:
    """Seconds until ``ends`` (loop time), for a statement's timeout."""
    left = ends - asyncio.get_running_loop().time()
    if left <= 0:
        raise DeadlineExceededError(
            f"the deadline of key {key} passed before its transactional claim was answered",
            key=key,
        )
    return left


def _caught(answer: Any, message: Any, key: str, operation: str = "claim") -> Exception:
    """The error for what the claim function caught (its SQLSTATE and message) — or a
    statement raised —, or for an answer that is not one."""
    message = "" if message is None else str(message)
    caller_timeout = answer == "57014" and "statement timeout" in message
    if answer == "55P03" or (caller_timeout and operation == "claim"):
        # The claim waited for a lock — the key's row (another open transaction's claim)
        # or the table (a migration) — as long as this call may, or as long as the
        # caller's statement_timeout let it.
        return LockTimeoutError(
            f"key {key} stayed locked by another open transaction (a transactional call on "
            "the same key, or a lock on the whole table) past this call's wait "
            "(Options(wait=Wait(timeout=...)), its deadline, or your statement_timeout); "
            "nothing of the call was written: your transaction is intact, retry later",
            key=key,
        )
    if answer == "40001":
        return SerializationFailureError(
            f"the {operation} of key {key} could not be serialized with a concurrent transaction "
            "(under REPEATABLE READ or SERIALIZABLE: e.g. a duplicate committed the record "
            "after this transaction's snapshot): roll the transaction back and run it again; "
            "under READ COMMITTED a duplicate replays instead",
            key=key,
            sqlstate="40001",
        )
    if answer == "40P01":
        return DeadlockDetectedError(
            f"PostgreSQL broke a deadlock by failing this transaction's {operation} of key "
            f"{key}: "
            "roll the transaction back and run it again",
            key=key,
            sqlstate="40P01",
        )
    if answer == "57014":
        return StoreUnavailableError(
            f"the transactional {operation} of key {key} was cancelled on the server "
            f"({message}); nothing of it was written"
        )
    return StoreUnavailableError(
        f"the server answered a transactional claim of key {key!r} with {answer!r}, which is "
        "not the claim function's answer; the callback was not run"
    )
