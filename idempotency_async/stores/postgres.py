"""A PostgreSQL record store on asyncpg: one table, one statement per operation.

Leases and expiry are judged by the server's ``clock_timestamp()`` (``judged_by="client"``
judges by the ``now`` the manager sends, for simulated time).  Each operation is one
statement in its own implicit transaction — no session state, no ``SET``, no advisory
locks — so the store works behind PgBouncer in transaction mode.  See ``docs/postgres.md``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, Self

from idempotency_async._redact import redact, redact_url, secrets_in
from idempotency_async.errors import (
    ConfigError,
    DeadlineExceededError,
    StoreUnavailableError,
)
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores._postgres_connections import (
    Driver,
    TransactionConnection,
    driver_of,
)
from idempotency_async.stores._postgres_errors import is_data_error, translated
from idempotency_async.stores._postgres_psycopg import PsycopgPool, is_psycopg_pool
from idempotency_async.stores._postgres_retry import is_refused_commit, retry_transaction
from idempotency_async.stores._postgres_schema import (
    REFUSED_COMMIT,
    SCHEMA_VERSION,
    Schema,
    schema,
)
from idempotency_async.stores._postgres_sql import (
    DEFAULT_TABLE,
    Statements,
    lock_wait,
    statements,
)
from idempotency_async.stores._postgres_steps import begin_step
from idempotency_async.stores._postgres_transaction import TransactionStore
from idempotency_async.stores._postgres_values import (
    check_key,
    claim_verdict,
    completion_text,
    record_from_row,
    text_column,
)
from idempotency_async.stores.base import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Extended,
    Stepped,
    StepTransaction,
    StepWrite,
    Verdict,
    Written,
    judge,
)

__all__ = [
    "DEFAULT_TABLE",
    "REFUSED_COMMIT",
    "SCHEMA_VERSION",
    "PostgresStore",
    "RecordPage",
    "TransactionConnection",
    "create_table",
    "is_refused_commit",
    "migrate_table",
    "migration_sql",
    "retry_transaction",
    "table_sql",
]

logger = logging.getLogger("idempotency_async.postgres")

_SCHEMES: Final = ("postgres://", "postgresql://")
_DEFAULT_POOL: Final = {"min_size": 1, "max_size": 10}
_VACUUM_BATCH: Final = 1000
_LATER: Final = object()  # from_url: the pool is created on first use
_PAGE: Final = 1000
_RELEASED: Final = 1.001
"""A released record's lease end (less a millisecond) when the manager's clock judges
(simulated time): long past on any clock, as MemoryStore's."""


class RecordPage(NamedTuple):
    """One page of :meth:`PostgresStore.pages`: the records it matched, the rows it read."""

    records: list[Record]
    scanned: int


class PostgresStore:
    """Keeps idempotency records in one PostgreSQL table, one row per key.

    ``pool`` is an ``asyncpg.Pool`` the caller opens and closes — or a psycopg 3
    ``psycopg_pool.AsyncConnectionPool`` in autocommit mode; :meth:`from_url` builds an
    asyncpg pool that the store owns and closes in :meth:`aclose`.  Create the table first with
    :func:`create_table` (or ``idempotency-async create-table postgres://…``; the SQL is in
    :func:`table_sql` for migrations).

    ``judged_by="server"`` (the default) judges leases and expiry by the server's
    ``clock_timestamp()``, so workers with skewed clocks agree; ``judged_by="client"`` uses
    the ``now`` the manager sends (for simulated time).  ``table`` is ``"name"`` or
    ``"schema.name"``, quoted as given.

    It records steps (recovery points, :class:`~idempotency_async.stores.base.RecordsSteps`)
    in the table's ``steps`` and ``step_count`` columns (schema version 3: a table made by
    an earlier version needs :func:`migrate_table`), and a transactional step's in the
    step's own transaction on the caller's connection.
    """

    db_system_name: Final = "postgresql"
    """What OpenTelemetry calls this store's database (``db.system.name``)."""

    def __init__(
        self,
        pool: Any,
        *,
        table: str = DEFAULT_TABLE,
        judged_by: Literal["server", "client"] = "server",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if is_psycopg_pool(pool):
            pool = PsycopgPool(pool)
        if pool is not _LATER and (
            hasattr(pool, "is_in_transaction") or not callable(getattr(pool, "fetchrow", None))
        ):
            raise ConfigError(
                "PostgresStore needs an asyncpg pool (await asyncpg.create_pool(dsn)) or a "
                f"psycopg AsyncConnectionPool, got {type(pool).__name__}; a single connection "
                "cannot serve concurrent calls. Or use PostgresStore.from_url('postgres://…')"
            )
        if judged_by not in ("server", "client"):
            raise ConfigError(f"judged_by must be 'server' or 'client', got {judged_by!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int):
            raise ConfigError(f"max_response_bytes must be an integer, got {max_response_bytes!r}")
        if max_response_bytes <= 0:
            raise ConfigError(f"max_response_bytes must be positive, got {max_response_bytes}")
        try:
            self._sql: Statements = statements(table, max_response_bytes)
            self._schema: Schema = schema(table)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.table = table
        self.judged_by = judged_by
        """Whose clock judges leases and expiry: ``"server"`` or ``"client"`` (the manager's)."""
        self.max_response_bytes = max_response_bytes
        self._pool: Any = None if pool is _LATER else pool
        self._client_clock = judged_by == "client"
        self._dsn: str | None = None
        self._pool_options: dict[str, Any] = {}
        self._opening: asyncio.Lock | None = None
        self._owns_pool = False
        self._closed = False
        self._guarded = False  # the table's transactional parts were found (once per store)

    @property
    def table_name(self) -> str:
        """The table, as OpenTelemetry reports it (``db.collection.name``)."""
        return self.table

    @classmethod
    def from_url(
        cls,
        dsn: str,
        *,
        pool_options: Mapping[str, Any] | None = None,
        table: str = DEFAULT_TABLE,
        judged_by: Literal["server", "client"] = "server",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> PostgresStore:
        """A store on an asyncpg pool built from ``dsn`` (``postgres://…`` or
        ``postgresql://…``), owned by the store and closed in :meth:`aclose`.

        ``pool_options`` go to ``asyncpg.create_pool`` (default ``min_size=1,
        max_size=10``); behind PgBouncer older than 1.21 add ``statement_cache_size=0``.
        No connection is made until the first operation.
        """
        if not isinstance(dsn, str) or not dsn.startswith(_SCHEMES):
            raise ConfigError(
                f"a Postgres DSN starts with postgres:// or postgresql://, got {_scheme(dsn)!r}"
            )
        _asyncpg()
        store = cls(_LATER, table=table, judged_by=judged_by, max_response_bytes=max_response_bytes)
        store._dsn = dsn
        store._pool_options = {**_DEFAULT_POOL, **(pool_options or {})}
        store._owns_pool = True
        return store

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool if the store built it (:meth:`from_url`); a caller's pool is left
        open.  The store refuses use afterwards."""
        self._closed = True
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _open(self) -> Any:
        if self._closed:
            raise closed_error("PostgresStore")
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                try:
                    self._pool = await _asyncpg().create_pool(self._dsn, **self._pool_options)
                except Exception as exc:
                    error = _connect_error(exc, self._dsn or "", self.table)
                    if error is exc:
                        raise
                    raise error from _cause(error, exc)
        return self._pool

    async def _fetchrow(self, operation: str, key: str, sql: str, *args: Any) -> Any:
        pool = self._pool if self._pool is not None and not self._closed else await self._open()
        try:
            return await pool.fetchrow(sql, *args)
        except Exception as exc:
            error = translated(exc, operation, key, self.table)
            if error is exc:
                raise
            raise error from exc

    async def _bounded_fetchrow(
        self, seconds: float, operation: str, key: str, sql: str, *args: Any
    ) -> Any:
        """:meth:`_fetchrow` abandoned after ``seconds`` (the call's deadline): waiting for a
        pooled connection and for locks the statement cannot bound itself (a migration's
        lock on the table) included; the driver cancels the statement on the server."""
        try:
            async with asyncio.timeout(seconds):
                return await self._fetchrow(operation, key, sql, *args)
        except TimeoutError as exc:
            if isinstance(exc, DeadlineExceededError):
                raise
            raise DeadlineExceededError(
                f"the Postgres {operation} of key {key} got no answer before the call's "
                "deadline (no pooled connection free, a lock on the table, or a slow server); "
                "it was cancelled",
                key=key,
            ) from exc

    async def _fetchrow_or_close(self, operation: str, key: str, sql: str, *args: Any) -> Any:
        """As :meth:`_fetchrow`, for a request its sender may abandon (a renewal not answered
        in time): cancelled, it closes its asyncpg connection at once.  asyncpg would send
        the server a cancel request and hold the connection (its release is shielded) until
        the statement's answer arrived — over a slow path, past the next renewals.
        (psycopg's pool closes a connection whose statement was cancelled twice, as the
        renewal does.)"""
        pool = self._pool if self._pool is not None and not self._closed else await self._open()
        acquire = getattr(pool, "acquire", None)
        if acquire is None:
            return await self._fetchrow(operation, key, sql, *args)
        try:
            async with acquire() as connection:
                try:
                    return await connection.fetchrow(sql, *args)
                except asyncio.CancelledError:
                    connection.terminate()  # nothing is left unread for the next request
                    raise
        except Exception as exc:
            error = translated(exc, operation, key, self.table)
            if error is exc:
                raise
            raise error from exc

    # -- Store protocol -------------------------------------------------------------

    async def claim(self, claim: Claim) -> Verdict:
        key = claim.key
        lease = float(claim.lease)
        row = await self._bounded_fetchrow(
            lease,
            "claim",
            key,
            self._sql.claim,
            key,
            claim.now if self._client_clock else None,
            claim.owner,
            lease,
            float(claim.ttl),
            claim.validation,
            # A row lock is held for one statement by another claim, but for a whole
            # transaction by a transactional call: wait for it as the call may wait (not at
            # all with wait=None), and no longer than the lease.
            lock_wait(min(claim.wait, lease)),
        )
        return claim_verdict(claim, row, self.max_response_bytes)

    async def get(self, key: str, *, now: float) -> Verdict:
        row = await self._fetchrow(
            "get", key, self._sql.get, key, now if self._client_clock else None
        )
        if row[0] is None:
            return judge(None, row[8])
        check_key(key, row[9])
        return judge(record_from_row(key, row, self.max_response_bytes), row[8])

    async def complete(self, completion: Completion) -> Written:
        key = completion.key
        text, reason = completion_text(completion, self.max_response_bytes)
        if text is None and completion.encoded is not None:
            logger.warning("the response for %r is %s; stored without it", key, reason)
        try:
            written = await self._complete(completion, text, reason)
        except StoreUnavailableError as exc:
            if text is None or not is_data_error(exc.__cause__ or exc):
                raise
            # The server refused the value itself (a lone surrogate, say): the record
            # completes without it rather than staying in progress.
            reason = f"not storable as jsonb ({exc.__cause__})"[:300]
            logger.warning("the response for %r is %s; stored without it", key, reason)
            text = None
            written = await self._complete(completion, None, reason)
        if written is None:
            return Written.NOTHING
        if not written:
            return Written.RESPONSE  # the owner's response, kept: it is final
        return Written.WITHOUT_RESPONSE if text is None else Written.RESPONSE

    async def _complete(
        self, completion: Completion, text: str | None, reason: str | None
    ) -> bool | None:
        """True: written; False: the owner's response kept; None: not the owner's record."""
        row = await self._fetchrow(
            "complete",
            completion.key,
            self._sql.complete,
            completion.key,
            completion.owner,
            completion.now if self._client_clock else None,
            float(completion.ttl),
            completion.validation,
            text,
            None if text is not None else text_column(reason),
        )
        return None if row is None else row[0] is not False

    async def release(self, key: str, owner: str) -> bool:
        """Delete the owner's record — or, when it carries steps, release it with them (no
        owner, its lease ended a millisecond ago): one statement.  True also when the
        record is gone or already released."""
        row = await self._fetchrow(
            "release", key, self._sql.release, key, owner, _RELEASED if self._client_clock else None
        )
        return bool(row[0])

    async def record_step(self, write: StepWrite) -> Stepped:
        """Write a recovery point on the owner's INPROGRESS record (one owner-fenced
        ``UPDATE``): when it holds ``write.position`` steps, or already exactly
        ``write.steps``.  ``TOO_LARGE`` (no round trip) above ``max_response_bytes``."""
        steps = write.steps
        if len(steps) > self.max_response_bytes or (
            len(steps.encode("utf-8", "surrogatepass")) > self.max_response_bytes
        ):
            return Stepped.TOO_LARGE
        row = await self._fetchrow(
            "step",
            write.key,
            self._sql.record_step,
            write.key,
            write.owner,
            write.now if self._client_clock else None,
            int(write.position),
            steps,
            float(write.ttl),
        )
        return Stepped.LOST if row is None else Stepped.RECORDED

    async def extend(self, claim: Claim) -> Extended:
        row = await self._fetchrow_or_close(
            "extend",
            claim.key,
            self._sql.extend,
            claim.key,
            claim.owner,
            claim.now if self._client_clock else None,
            float(claim.lease),
            float(claim.ttl),
            claim.validation,
        )
        if row is None:
            return Extended.LOST
        return Extended.RENEWED if row[0] else Extended.ALREADY_LATER

    async def force_release(self, key: str) -> Record | None:
        row = await self._fetchrow("force release", key, self._sql.force_release, key)
        if row is None:
            return None
        check_key(key, row[8])
        return record_from_row(key, row, self.max_response_bytes)

    async def release_exactly(self, record: Record) -> bool:
        """Delete the record of ``record.key`` only if it is still ``record``: the same
        owner, status, expiry, lease end and recovery points (what ``idempotency-async
        release`` showed the operator; the whole step list, so a row whose list was cut at
        this store's read bound is never deleted this way).  False, deleting nothing, when
        the key holds another record or none.  One statement; it waits at most 2 s for a
        row an open transaction holds."""
        row = await self._fetchrow(
            "release exactly",
            record.key,
            self._sql.release_exactly,
            record.key,
            record.owner,
            record.status.value,
            float(record.expiration),
            record.lease_end,
            record.steps,
        )
        return row is not None

    async def begin_step(self, connection: Any) -> StepTransaction:
        """A transactional step's own transaction on the caller's ``connection`` (asyncpg,
        psycopg 3, or SQLAlchemy's ``AsyncConnection`` / ``AsyncSession``), which must not
        be in a transaction: ``BEGIN`` now; the recovery point is written through it by the
        table's step function, and committed with the step's writes
        (:class:`~idempotency_async.stores.base.RecordsStepsIn`)."""
        if self._closed:
            raise closed_error("PostgresStore")
        return await begin_step(
            connection, self._schema, self.table, self._client_clock, self.max_response_bytes
        )

    # -- transactional calls ---------------------------------------------------------

    async def transaction_store(self, connection: TransactionConnection) -> TransactionStore:
        """This store's operations on the caller's ``connection``, in its transaction (what
        ``Manager.execute_in_transaction`` runs on).  ``ConfigError`` before any statement
        on it when it is not a connection in a transaction, or when the table lacks its
        transactional parts (checked once per store: run :func:`migrate_table`)."""
        if self._closed:
            raise closed_error("PostgresStore")
        driver, session = await driver_of(connection)
        if not self._guarded:
            await self._check_guard(driver)
        return TransactionStore(driver, self._schema, self.table, self.max_response_bytes, session)

    async def _check_guard(self, driver: Driver) -> None:
        """``ConfigError`` (with the SQL to run) unless the table has the claim function and
        an enabled guard trigger of this schema version.  Read on the caller's connection
        (a catalog read, harmless in its transaction): on the store's pool it could wait for
        a connection the callers' transactions all hold."""
        sql = self._schema
        try:
            row = await driver.fetchrow(sql.check, *sql.check_args)
        except Exception as exc:
            error = translated(exc, "schema check", "", self.table)
            if error is exc:
                raise
            raise error from exc
        if row is not None and all(row):
            self._guarded = True
            return
        missing = "the table" if row is None or not row[0] else "its transactional parts"
        if row is not None and row[0] and row[1] and not row[2]:
            missing = "its guard trigger (disabled or dropped)"
        raise ConfigError(
            f"transactional calls need schema version {SCHEMA_VERSION} of {self.table}, and "
            f"{missing} is missing: run `idempotency-async migrate --store "
            f"'postgres://…?table={self.table}'` (or migrate_table(pool, table=...); "
            "`--print-sql` prints it for a migration tool, docs/postgres.md). The SQL:\n"
            + migration_sql(self.table)
        )

    # -- operators ------------------------------------------------------------------

    async def pages(
        self, *, status: Status | None = None, page_size: int | None = None
    ) -> AsyncGenerator[RecordPage, None]:
        """The table's records in key order, ``page_size`` (default 1000) per statement,
        optionally only those with ``status``; expired rows not vacuumed yet included.
        Meant for operators (``idempotency-async list``), not for the request path."""
        size = _PAGE if page_size is None else page_size
        wanted = None if status is None else Status(status).value
        after = ""
        while True:
            pool = await self._open()
            try:
                rows = await pool.fetch(self._sql.page, after, wanted, size)
            except Exception as exc:
                error = translated(exc, "list", "", self.table)
                if error is exc:
                    raise
                raise error from exc
            records = [record_from_row(row[0], row[1:], self.max_response_bytes) for row in rows]
            yield RecordPage(records, len(rows))
            if len(rows) < size:
                return
            after = rows[-1][0]

    # -- maintenance ----------------------------------------------------------------

    async def vacuum(
        self, *, batch_size: int = _VACUUM_BATCH, max_batches: int | None = None
    ) -> int:
        """Delete expired records, ``batch_size`` rows per statement (each its own short
        transaction, skipping rows another transaction holds), until none is left or
        ``max_batches`` ran.  Returns how many were deleted.

        Expired rows never block a claim (a claim replaces them), so this only keeps the
        table small: run it from a scheduled job or ``idempotency-async vacuum``.  Expiry
        is judged by the server's clock, whatever the store's ``judged_by``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
            raise ConfigError(f"max_batches must be an integer >= 1 or None, got {max_batches!r}")
        deleted, batches = 0, 0
        while max_batches is None or batches < max_batches:
            row = await self._fetchrow("vacuum", "", self._sql.vacuum, None, batch_size)
            count = int(row[0])
            deleted, batches = deleted + count, batches + 1
            if count < batch_size:
                break
        return deleted


def table_sql(table: str = DEFAULT_TABLE) -> str:
    """The SQL that creates the store's table, its expiry index and its transactional parts
    (schema version :data:`SCHEMA_VERSION`; every statement idempotent), for migrations."""
    return _script(_schema_of(table).create)


def migration_sql(table: str = DEFAULT_TABLE) -> str:
    """The SQL that brings a table created by an earlier version of the library to
    :data:`SCHEMA_VERSION` (idempotent): what :func:`migrate_table` runs."""
    return _script(_schema_of(table).migrate)


async def create_table(pool_or_dsn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Create the store's table, its expiry index and its transactional parts if they do
    not exist (:func:`table_sql`).

    ``pool_or_dsn``: an asyncpg pool or connection, a psycopg ``AsyncConnectionPool`` in
    autocommit mode, or a ``postgres://`` DSN (a connection is opened and closed for it).
    The user needs ``CREATE`` on the schema (and owns the table it creates).
    """
    await _apply(pool_or_dsn, _schema_of(table).create, table)


async def migrate_table(pool_or_dsn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Add to an existing table what :data:`SCHEMA_VERSION` needs (:func:`migration_sql`):
    the recovery points' columns (``ADD COLUMN … NULL``: the catalog only, no rewrite), the
    guard trigger, and the claim and step functions of transactional calls.  Idempotent;
    run it as the table's owner, before the library that needs it is deployed.
    ``pool_or_dsn`` as for :func:`create_table`."""
    await _apply(pool_or_dsn, _schema_of(table).migrate, table)


def _schema_of(table: str) -> Schema:
    try:
        return schema(table)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _script(statements_: tuple[str, ...]) -> str:
    return "".join(statement + ";\n" for statement in statements_)


async def _apply(pool_or_dsn: Any, create: tuple[str, ...], table: str) -> None:
    if is_psycopg_pool(pool_or_dsn):
        pool_or_dsn = PsycopgPool(pool_or_dsn)
    if isinstance(pool_or_dsn, str):
        if not pool_or_dsn.startswith(_SCHEMES):
            raise ConfigError(
                "a Postgres DSN starts with postgres:// or postgresql://, got "
                f"{_scheme(pool_or_dsn)!r}"
            )
        try:
            connection = await _asyncpg().connect(pool_or_dsn)
        except Exception as exc:
            error = _connect_error(exc, pool_or_dsn, table)
            raise error from _cause(error, exc)
        try:
            await _create(connection, create, table)
        finally:
            await connection.close()
        return
    await _create(pool_or_dsn, create, table)


async def _create(target: Any, create: tuple[str, ...], table: str) -> None:
    try:
        # One statement at a time (each idempotent: a migration cut short is run again).
        for statement in create:
            await target.execute(statement)
    except Exception as exc:
        error = translated(exc, "create table", "", table)
        if error is exc:
            raise
        raise error from exc


def _connect_error(exc: Exception, dsn: str, table: str) -> Exception:
    """A failure to connect as the library's error: a DSN asyncpg cannot parse (a port that
    is not a number, say) is ``ConfigError`` saying what, never the password; the rest as
    :func:`translated`."""
    if isinstance(exc, ValueError | TypeError) and not hasattr(exc, "sqlstate"):
        return ConfigError(
            f"cannot connect with the DSN {redact_url(dsn)!r}: "
            f"{redact(str(exc), secrets_in(dsn))[:200]} — check its host, port and query "
            "parameters"
        )
    return translated(exc, "connect", "", table)


def _cause(error: Exception, exc: Exception) -> Exception | None:
    # A DSN that did not parse is not chained: the driver's message may quote the password.
    return None if isinstance(error, ConfigError) else exc


def _scheme(dsn: object) -> str:
    """What a DSN-like value starts with: never its credentials."""
    if not isinstance(dsn, str):
        return type(dsn).__name__
    return dsn.split("//", 1)[0] + "//…" if "//" in dsn else "a string without //"


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise ConfigError(
            "PostgresStore needs asyncpg: pip install 'idempotency-async[postgres]'"
        ) from exc
    return asyncpg
