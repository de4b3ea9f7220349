"""The SQL of the Postgres store: the table, and one statement per operation.

Every statement is one round trip and judges by one instant, ``now`` (Unix seconds as
``float8``): the parameter the manager sent (``clock="client"``) or, when that is NULL,
the server's ``clock_timestamp()`` — never ``now()``, which is the start of the
transaction and stands still behind a pooler that keeps transactions open.

The claim must return the row that refused it, read in the same atomic step.  Before
PostgreSQL 18, ``RETURNING`` sees only the new row version, and a second ``SELECT`` in the
same statement sees the statement's snapshot, which misses a row another transaction
committed while this one waited for its lock.  So the claim's ``ON CONFLICT DO UPDATE``
always updates: each column becomes the claim's value when the key is claimable, and stays
as it was otherwise.  ``RETURNING`` then gives the row as the claim left it — the new
claim, or the unchanged record that blocked it, as the server judged it under the row
lock.  The refused claim's rewrite is a HOT update (no indexed value changes).

Instants follow :mod:`idempotency_async.record`: expiry ``ceil(now + max(ttl, lease))``
in whole seconds, lease end ``now + lease`` (microseconds, ``timestamptz``).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = ["COLUMNS", "DEFAULT_TABLE", "Statements", "quote_table", "statements"]

DEFAULT_TABLE: Final = "idempotency_records"
COLUMNS: Final = (
    "status",
    "owner",
    "expires_at",
    "lease_ends_at",
    "validation",
    "response",
    "not_stored",
)
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_NOW: Final = "coalesce({param}::float8, extract(epoch FROM clock_timestamp())::float8)"
# What a statement returns about a record: its fields, instants as Unix seconds.
_RECORD: Final = (
    "r.status, r.owner, extract(epoch FROM r.expires_at)::float8 AS expires, "
    "extract(epoch FROM r.lease_ends_at)::float8 AS lease_end, r.validation, "
    "r.response::text AS response, r.not_stored"
)


class Statements(NamedTuple):
    """The store's SQL for one table (built once per store)."""

    create: tuple[str, ...]
    claim: str
    get: str
    complete: str
    release: str
    extend: str
    force_release: str
    vacuum: str
    page: str


def quote_table(name: str) -> str:
    """``name`` (``table`` or ``schema.table``) as a quoted SQL identifier.

    Raises ``ValueError`` for anything but plain identifiers: the name is spliced into SQL.
    """
    parts = name.split(".") if isinstance(name, str) else []
    if not 1 <= len(parts) <= 2 or not all(_NAME.fullmatch(part) for part in parts):
        raise ValueError(
            f"a table name is 'table' or 'schema.table', each part letters, digits or _ "
            f"(at most 63, not starting with a digit), got {name!r}"
        )
    return ".".join(f'"{part}"' for part in parts)


def statements(table: str) -> Statements:
    """The statements for ``table`` (already checked by :func:`quote_table`)."""
    t = quote_table(table)
    index = '"' + table.split(".")[-1][:50] + '_expires_at"'
    create = (
        f"CREATE TABLE IF NOT EXISTS {t} (\n"
        "    key text PRIMARY KEY,\n"
        "    status text NOT NULL CHECK (status IN ('INPROGRESS', 'COMPLETED')),\n"
        "    owner text,\n"
        "    expires_at timestamptz NOT NULL,\n"
        "    lease_ends_at timestamptz,\n"
        "    validation text,\n"
        "    response jsonb,\n"
        "    not_stored text\n"
        ")",
        f"CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at)",
    )
    claimable = (
        "(r.expires_at < to_timestamp(n.now) OR (r.status = 'INPROGRESS' AND "
        "(r.owner = $3 OR r.lease_ends_at < to_timestamp(n.now))))"
    )
    keep_or_take = ",\n    ".join(
        f"{column} = CASE WHEN c.claimable THEN excluded.{column} ELSE r.{column} END"
        for column in COLUMNS
    )
    # The CASEs read ``claimable`` from a sub-select over the conflicting row (``r``).
    keep_or_take = keep_or_take.replace("c.claimable", f"(SELECT {claimable} FROM n)")
    claim = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$2")} AS now),
w AS (
  INSERT INTO {t} AS r (key, {", ".join(COLUMNS)})
  SELECT $1, 'INPROGRESS', $3, to_timestamp(ceil(n.now + greatest($5::float8, $4::float8))),
         to_timestamp(n.now + $4::float8), $6, NULL, NULL
  FROM n
  ON CONFLICT (key) DO UPDATE SET
    {keep_or_take}
  RETURNING {_RECORD}
)
SELECT w.*, n.now FROM w, n"""
    get = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$2")} AS now)
SELECT {_RECORD}, n.now FROM n LEFT JOIN {t} AS r ON r.key = $1"""
    # The response travels as text and is cast on the server: an application's pool may
    # carry its own jsonb codec (json.dumps), which would encode the text a second time.
    complete = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$3")} AS now)
UPDATE {t} AS r SET status = 'COMPLETED',
  expires_at = to_timestamp(ceil(n.now + greatest($4::float8, 0))),
  lease_ends_at = NULL, validation = $5, response = $6::text::jsonb, not_stored = $7
FROM n WHERE r.key = $1 AND r.owner = $2
RETURNING 1"""
    # Gone counts as released; a record another claim holds is not.
    release = f"""WITH d AS (DELETE FROM {t} WHERE key = $1 AND owner = $2 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM d) OR NOT EXISTS (SELECT 1 FROM {t} WHERE key = $1)"""
    extend = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$3")} AS now)
UPDATE {t} AS r SET
  expires_at = to_timestamp(ceil(n.now + greatest($5::float8, $4::float8))),
  lease_ends_at = to_timestamp(n.now + $4::float8), validation = $6
FROM n WHERE r.key = $1 AND r.owner = $2 AND r.status = 'INPROGRESS'
RETURNING 1"""
    force_release = f"DELETE FROM {t} AS r WHERE r.key = $1 RETURNING {_RECORD}"
    # One bounded batch: the oldest expired rows no other transaction holds.  An expired
    # record's lease has ended too (expiry is never before the lease end).
    vacuum = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$1")} AS now),
doomed AS (
  SELECT key FROM {t}, n WHERE expires_at < to_timestamp(n.now)
  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED
),
d AS (DELETE FROM {t} AS r USING doomed WHERE r.key = doomed.key RETURNING 1)
SELECT count(*) FROM d"""
    # Operators' listing: keyset pages in key order, optionally one status.
    page = f"""SELECT r.key, {_RECORD} FROM {t} AS r
WHERE r.key > $1 AND ($2::text IS NULL OR r.status = $2) ORDER BY r.key LIMIT $3"""
    return Statements(create, claim, get, complete, release, extend, force_release, vacuum, page)
