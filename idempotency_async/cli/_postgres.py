"""``postgres://…`` / ``postgresql://…`` URLs: a PostgresStore, its table, and ``vacuum``.

``table=NAME`` (``name`` or ``schema.name``) picks the table; every other query parameter
stays in the DSN that asyncpg reads (``sslmode``, …).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult, parse_qsl, urlencode

from idempotency_async.cli._errors import CliError

__all__ = ["PostgresTarget", "parse"]

_STORE_OPTIONS: Final = ("table",)
# The store's own page when none is asked for (PostgresStore.pages), and the largest a
# --limit makes.
_PAGE_ROWS: Final = 1000


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    dsn: str = field(repr=False)  # holds the password
    table: str

    def store(self, aws: Any) -> Any:
        return _module().PostgresStore.from_url(self.dsn, table=self.table)

    def pages(
        self, store: Any, *, status: Any, page_size: int | None, limit: int | None = None
    ) -> AsyncGenerator[Any, None]:
        """``list``: the store's records in key order (keyset pages).  The status filter is
        in the statement, so without a ``page_size`` a page holds at most ``limit`` rows."""
        if page_size is None and limit is not None:
            page_size = min(limit, _PAGE_ROWS)
        pages: AsyncGenerator[Any, None] = store.pages(status=status, page_size=page_size)
        return pages

    async def vacuum(self, *, batch_size: int, max_batches: int | None) -> int:
        """Delete expired records in bounded batches; how many were deleted."""
        store = self.store(None)
        try:
            deleted: int = await store.vacuum(batch_size=batch_size, max_batches=max_batches)
        finally:
            await store.aclose()
        return deleted

    def sql(self) -> str:
        """The SQL that creates the table (for migrations)."""
        return str(_module().table_sql(self.table))

    async def create_table(self) -> None:
        await _module().create_table(self.dsn, table=self.table)

    def migration_sql(self) -> str:
        """The SQL that brings an older table to the library's schema version."""
        return str(_module().migration_sql(self.table))

    async def migrate(self) -> None:
        await _module().migrate_table(self.dsn, table=self.table)

    def schema_version(self) -> int:
        return int(_module().SCHEMA_VERSION)


def parse(parts: SplitResult) -> PostgresTarget:
    if not parts.netloc and not parts.path.strip("/"):
        raise CliError("bad store URL: write postgres://USER@HOST:PORT/DATABASE?table=NAME")
    table = ""
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _STORE_OPTIONS:
            if table:
                raise CliError(f"parameter {name!r} appears twice in the store URL")
            table = value
        else:
            rest.append((name, value))
    module = _module()
    table = table or module.DEFAULT_TABLE
    try:
        module.table_sql(table)  # checks the name
    except ValueError as exc:  # ConfigError
        raise CliError(f"bad table= in the store URL: {exc}") from exc
    return PostgresTarget(parts._replace(query=urlencode(rest)).geturl(), table)


def _module() -> Any:
    try:
        # By name: the Postgres store needs asyncpg (extra "postgres"), which may be absent.
        module: Any = importlib.import_module("idempotency_async.stores.postgres")
        importlib.import_module("asyncpg")
    except ImportError as exc:
        raise CliError(
            "the Postgres store is not available: install the postgres extra "
            f"(pip install 'idempotency-async[postgres]') ({exc})"
        ) from exc
    return module
