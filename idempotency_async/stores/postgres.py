"""A PostgreSQL record store on asyncpg: one table, one statement per operation.

Leases and expiry are judged by the server's ``clock_timestamp()`` (``clock="client"``
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

from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores._postgres_errors import is_data_error, translated
from idempotency_async.stores._postgres_psycopg import PsycopgPool, is_psycopg_pool
from idempotency_async.stores._postgres_sql import (
    DEFAULT_TABLE,
    Statements,
    lock_wait,
    statements,
)
from idempotency_async.stores._postgres_transaction import TransactionStore, bind
from idempotency_async.stores._postgres_values import (
    claim_verdict,
    completion_text,
    record_from_row,
    text_column,
)
from idempotency_async.stores.base import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Extended,
    Verdict,
    Written,
    judge,
)

__all__ = ["DEFAULT_TABLE", "PostgresStore", "RecordPage", "create_table", "table_sql"]

logger = logging.getLogger("idempotency_async.postgres")

_SCHEMES: Final = ("postgres://", "postgresql://")
_DEFAULT_POOL: Final = {"min_size": 1, "max_size": 10}
_VACUUM_BATCH: Final = 1000
_LATER: Final = object()  # from_url: the pool is created on first use
_PAGE: Final = 1000


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

    ``clock="server"`` (the default) judges leases and expiry by the server's
    ``clock_timestamp()``, so workers with skewed clocks agree; ``clock="client"`` uses
    the ``now`` the manager sends (for simulated time).  ``table`` is ``"name"`` or
    ``"schema.name"``, quoted as given.
    """

    db_system_name: Final = "postgresql"
    """What OpenTelemetry calls this store's database (``db.system.name``)."""

    def __init__(
        self,
        pool: Any,
        *,
        table: str = DEFAULT_TABLE,
        clock: Literal["server", "client"] = "server",
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
        if clock not in ("server", "client"):
            raise ConfigError(f"clock must be 'server' or 'client', got {clock!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int):
            raise ConfigError(f"max_response_bytes must be an integer, got {max_response_bytes!r}")
        if max_response_bytes <= 0:
            raise ConfigError(f"max_response_bytes must be positive, got {max_response_bytes}")
        try:
            self._sql: Statements = statements(table)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.table = table
        self.clock = clock
        self.max_response_bytes = max_response_bytes
        self._pool: Any = None if pool is _LATER else pool
        self._client_clock = clock == "client"
        self._dsn: str | None = None
        self._pool_options: dict[str, Any] = {}
        self._opening: asyncio.Lock | None = None
        self._owns_pool = False
        self._closed = False

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
        clock: Literal["server", "client"] = "server",
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
        store = cls(_LATER, table=table, clock=clock, max_response_bytes=max_response_bytes)
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
                    error = translated(exc, "connect", "", self.table)
                    if error is exc:
                        raise
                    raise error from exc
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
        row = await self._fetchrow(
            "claim",
            key,
            self._sql.claim,
            key,
            claim.now if self._client_clock else None,
            claim.owner,
            float(claim.lease),
            float(claim.ttl),
            claim.validation,
            # A row lock is held for one statement by another claim, but for a whole
            # transaction by a transactional call: wait for it no longer than the lease.
            lock_wait(claim.lease),
        )
        return claim_verdict(claim, row, self.max_response_bytes)

    async def get(self, key: str, *, now: float) -> Verdict:
        row = await self._fetchrow(
            "get", key, self._sql.get, key, now if self._client_clock else None
        )
        if row[0] is None:
            return judge(None, row[7])
        return judge(record_from_row(key, row, self.max_response_bytes), row[7])

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
        if not written:
            return Written.NOTHING
        return Written.WITHOUT_RESPONSE if text is None else Written.RESPONSE

    async def _complete(self, completion: Completion, text: str | None, reason: str | None) -> bool:
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
        return row is not None

    async def release(self, key: str, owner: str) -> bool:
        row = await self._fetchrow("release", key, self._sql.release, key, owner)
        return bool(row[0])

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
        return record_from_row(key, row, self.max_response_bytes)

    # -- transactional calls ---------------------------------------------------------

    async def transaction_store(self, connection: Any) -> TransactionStore:
        """This store's operations on the caller's ``connection``, in its transaction (what
        ``Manager.execute_in_transaction`` runs on).  ``ConfigError`` before any statement
        when the connection is not in a transaction."""
        if self._closed:
            raise closed_error("PostgresStore")
        return await bind(connection, self._sql, self.table, self.max_response_bytes)

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
        is judged by the server's clock, whatever the store's ``clock``.
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
    """The SQL that creates the store's table and its expiry index (idempotent), for
    migrations."""
    try:
        create = statements(table).create
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return "".join(statement + ";\n" for statement in create)


async def create_table(pool_or_dsn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Create the store's table and its expiry index if they do not exist.

    ``pool_or_dsn``: an asyncpg pool or connection, a psycopg ``AsyncConnectionPool`` in
    autocommit mode, or a ``postgres://`` DSN (a connection is opened and closed for it).
    """
    try:
        create = statements(table).create
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
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
            raise translated(exc, "connect", "", table) from exc
        try:
            await _create(connection, create, table)
        finally:
            await connection.close()
        return
    await _create(pool_or_dsn, create, table)


async def _create(target: Any, create: tuple[str, ...], table: str) -> None:
    try:
        for statement in create:
            await target.execute(statement)
    except Exception as exc:
        error = translated(exc, "create table", "", table)
        if error is exc:
            raise
        raise error from exc


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
