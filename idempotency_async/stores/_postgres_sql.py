"""The SQL of the Postgres store: the table, and one statement per operation.

Every statement is one round trip and judges by one instant, ``now`` (Unix seconds as
``float8``): the parameter the manager sent (``judged_by="client"``) or, when that is NULL,
the server's ``clock_timestamp()`` — never ``now()``, which is the start of the
transaction and stands still behind a pooler that keeps transactions open.

The claim must return the row that refused it, read in the same atomic step, and should
not write when it is refused (a replay or a 409 is then a plain read: no row lock, no WAL,
no commit to flush).  The statement reads the key's row in its snapshot (``old``):

- a row there that is not claimable answers the claim as it is — the statement is
  judged at its snapshot, like any read — and the ``INSERT`` gets no row to insert;
- otherwise the ``INSERT … ON CONFLICT DO UPDATE`` runs.  Under the row lock it judges
  the latest version, which may differ from the snapshot's (a row committed while this
  statement waited): when that version is claimable, every column takes the claim's
  value; when it is another version than the snapshot's but not claimable, every column
  keeps its value — a rewrite, only in that race — so that ``RETURNING`` shows it (before
  PostgreSQL 18 ``RETURNING`` sees only new row versions, and the snapshot never sees a
  row committed after it).  ``ctid`` tells the versions apart: the snapshot keeps its
  version from being vacuumed while the statement runs.

A claim waits for a row lock another transaction holds (an open transactional call's, until
it ends) at most ``$7`` (a ``lock_timeout`` value such as ``'1500ms'``), set for that
statement's transaction only: a lease-mode call's ``wait`` and deadline bound its claim too.

Rows are untrusted input (another tool may write the table): every statement returns a
record's text columns cut to bounds the library could have written (see
:func:`statements`), so the server never sends what the library would refuse.

Recovery points (schema version 3): ``steps`` holds a call's step list as the JSON text the
manager wrote (``text``, not ``jsonb``: a resent write is recognised by comparing the text
exactly, and ``jsonb`` would reorder and respace it), ``step_count`` its length; both NULL
on every record of a call that took no step.  A claim keeps them when it takes over an
unexpired in-progress row with its own validation hash, drops them with an expired row, and
refuses (writes nothing) a lapsed or released unexpired row carrying another payload's
steps; a completion drops them; a release of a row carrying them writes the *released*
state (no owner, its lease ended a millisecond ago) instead of deleting it.

Instants follow :mod:`idempotency_async.record`: expiry ``ceil(now + max(ttl, lease))``
in whole seconds, lease end ``now + lease`` (microseconds, ``timestamptz``).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from idempotency_async.stores.base import DEFAULT_MAX_RESPONSE_BYTES

__all__ = [
    "COLUMNS",
    "DEFAULT_TABLE",
    "TOKEN_LIMIT",
    "Statements",
    "lock_wait",
    "quote_table",
    "read_limit",
    "completion_wrote",
    "record_columns",
    "response_kept",
    "statements",
    "steps_ddl",
    "steps_take",
]

DEFAULT_TABLE: Final = "idempotency_records"
COLUMNS: Final = (
    "status",
    "owner",
    "expires_at",
    "lease_ends_at",
    "validation",
    "response",
    "not_stored",
    "steps",
    "step_count",
)
_OPERATOR_LOCK_WAIT: Final = "2s"
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_NOW: Final = "coalesce({param}::float8, extract(epoch FROM clock_timestamp())::float8)"
# The key of the row an answer came from, last in every answer about one key: a key
# column that compares other than byte for byte (citext, a nondeterministic collation)
# would find another key's row.
_STORED_KEY: Final = "r.key::text AS stored_key"
TOKEN_LIMIT: Final = 256
"""The longest owner token or validation hash read back (the library writes < 100
characters): one character more is read, so a longer one is seen as malformed."""
_REASON_LIMIT: Final = 300  # a not-stored reason, as the library writes it
_READ_FACTOR: Final = 4  # a response as jsonb prints it (", " and ": ") vs. as written


def response_kept(response: str) -> str:
    """In a completion's ``SET`` (``r``: the row as it was; ``response``: the parameter of
    the response's text): the owner's row holds a response and the completion brings none
    — its first completion without one, resent after its answer was lost, landing after
    the response was attached.  A response is final: every column then keeps its value.
    Judged on the latest row version, under the row lock, within the statement."""
    return f"({response}::text IS NULL AND r.status = 'COMPLETED' AND r.response IS NOT NULL)"


def completion_wrote(response: str) -> str:
    """In a completion's ``RETURNING`` (``r``: the row as written): false when the row was
    kept (:func:`response_kept`)."""
    return f"{response}::text IS NOT NULL OR r.response IS NULL"


def read_limit(max_response_bytes: int) -> int:
    """The most characters of a response's text a statement sends back: one more than
    the longest the store reads (``_postgres_values.decode_response``)."""
    return _READ_FACTOR * max_response_bytes + 1024 + 1


def record_columns(alias: str, limit: int | str) -> str:
    """What a statement returns about a record (the ``alias`` row): its fields, instants as
    Unix seconds, text cut to bounds (``limit``: the response's and the step list's, a
    number or a parameter)."""
    r = alias
    return (
        f"{r}.status, left({r}.owner, {TOKEN_LIMIT + 1}) AS owner, "
        f"extract(epoch FROM {r}.expires_at)::float8 AS expires, "
        f"extract(epoch FROM {r}.lease_ends_at)::float8 AS lease_end, "
        f"left({r}.validation, {TOKEN_LIMIT + 1}) AS validation, "
        f"left({r}.response::text, {limit}) AS response, "
        f"left({r}.not_stored, {_REASON_LIMIT}) AS not_stored, "
        f"left({r}.steps, {limit}) AS steps"
    )


def steps_take(row: str, now: str, validation: str) -> tuple[str, str]:
    """(a claim's condition refusing the ``row`` it would take over, its keep of the step
    columns) — the rule of recovery points on a claim, judged at ``now`` (a
    ``timestamptz`` expression) for a claim carrying ``validation``:

    - refused: the row is unexpired, in progress, and carries steps under another
      validation hash (another payload's progress: the answer is "resumable");
    - kept: the steps of an unexpired row the claim takes over (it is then in progress,
      with the claim's own validation hash, or carries none);
    - dropped: those of an expired row.
    """
    r = row
    refused = (
        f"({r}.steps IS NOT NULL AND {r}.expires_at >= {now} AND {r}.status = 'INPROGRESS' "
        f"AND {r}.validation IS DISTINCT FROM {validation})"
    )
    keep = ",\n    ".join(
        f"{column} = CASE WHEN {r}.expires_at < {now} THEN NULL ELSE {r}.{column} END"
        for column in ("steps", "step_count")
    )
    return refused, keep


class Statements(NamedTuple):
    """The store's SQL for one table (built once per store)."""

    create: tuple[str, ...]
    claim: str
    get: str
    complete: str
    release: str
    extend: str
    force_release: str
    release_exactly: str
    vacuum: str
    page: str
    record_step: str


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


def table_ddl(table: str) -> tuple[str, ...]:
    """The statements creating ``table`` and its expiry index, if missing."""
    t = quote_table(table)
    index = '"' + table.split(".")[-1][:50] + '_expires_at"'
    return (
        f"CREATE TABLE IF NOT EXISTS {t} (\n"
        "    key text PRIMARY KEY,\n"
        "    status text NOT NULL CHECK (status IN ('INPROGRESS', 'COMPLETED')),\n"
        "    owner text,\n"
        "    expires_at timestamptz NOT NULL,\n"
        "    lease_ends_at timestamptz,\n"
        "    validation text,\n"
        "    response jsonb,\n"
        "    not_stored text,\n"
        "    steps text,\n"
        "    step_count integer\n"
        ")",
        f"CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at)",
    )


def steps_ddl(table: str) -> str:
    """What schema version 3 adds to an existing table: the recovery points' columns
    (NULL, no default: a change of the catalog only, no rewrite of the rows)."""
    t = quote_table(table)
    return (
        f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS steps text, "
        "ADD COLUMN IF NOT EXISTS step_count integer"
    )


def statements(table: str, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> Statements:
    """The statements for ``table`` (already checked by :func:`quote_table`), reading back
    at most what a store with ``max_response_bytes`` would accept."""
    t = quote_table(table)
    record = record_columns("r", read_limit(max_response_bytes))
    create = table_ddl(table)
    now = "to_timestamp(n.now)"
    refused, _ = steps_take("r", now, "$6")
    # (The SET reads ``n`` through a sub-select, as the CASEs below read ``claimable``.)
    _, keep_steps = steps_take("r", "(SELECT to_timestamp(n.now) FROM n)", "$6")
    refused_old = (
        "(o.steps IS NOT NULL AND o.expires >= n.now AND o.status = 'INPROGRESS' "
        "AND o.validation IS DISTINCT FROM $6)"
    )
    claimable = (
        f"((r.expires_at < {now} OR (r.status = 'INPROGRESS' AND "
        f"(r.owner = $3 OR r.lease_ends_at < {now}))) AND NOT {refused})"
    )
    claimable_old = (
        "((o.expires < n.now OR (o.status = 'INPROGRESS' AND (o.owner = $3 OR "
        f"o.lease_end < n.now))) AND NOT {refused_old})"
    )
    keep_or_take = ",\n    ".join(
        f"{column} = CASE WHEN c.claimable THEN excluded.{column} ELSE r.{column} END"
        for column in COLUMNS[:-2]
    )
    # The steps: kept unless the row expired (a row the claim may not take is kept whole,
    # and an expired one is always claimable).
    keep_or_take += ",\n    " + keep_steps
    # The CASEs read ``claimable`` from a sub-select over the conflicting row (``r``).
    keep_or_take = keep_or_take.replace("c.claimable", f"(SELECT {claimable} FROM n)")
    fields = "status, owner, expires, lease_end, validation, response, not_stored, steps"
    # $7 bounds the claim's wait for a row lock (a row another transaction holds: a
    # transactional call's claim, until that transaction ends).  Transaction-local, and set
    # before the INSERT can wait: the INSERT reads ``n`` for its row.
    claim = f"""WITH n AS MATERIALIZED (
  SELECT {_NOW.format(param="$2")} AS now, set_config('lock_timeout', $7, true) AS lock_wait
),
old AS MATERIALIZED (
  SELECT r.ctid AS version, {record}, {_STORED_KEY} FROM {t} AS r WHERE r.key = $1
),
w AS (
  INSERT INTO {t} AS r (key, {", ".join(COLUMNS)})
  SELECT $1, 'INPROGRESS', $3, to_timestamp(ceil(n.now + greatest($5::float8, $4::float8))),
         to_timestamp(n.now + $4::float8), $6, NULL, NULL, NULL, NULL
  FROM n
  WHERE NOT EXISTS (SELECT 1 FROM old AS o WHERE {claimable_old} IS NOT TRUE)
  ON CONFLICT (key) DO UPDATE SET
    {keep_or_take}
  WHERE (SELECT {claimable} FROM n) OR r.ctid IS DISTINCT FROM (SELECT version FROM old)
  RETURNING {record}, {_STORED_KEY}
)
SELECT {fields}, n.now, stored_key FROM (
  SELECT 1 AS pick, {fields}, stored_key FROM w
  UNION ALL
  SELECT 2, {fields}, stored_key FROM old
) AS answer, n
ORDER BY pick LIMIT 1"""
    get = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$2")} AS now)
SELECT {record}, n.now, {_STORED_KEY} FROM n LEFT JOIN {t} AS r ON r.key = $1"""
    # The response travels as text and is cast on the server: an application's pool may
    # carry its own jsonb codec (json.dumps), which would encode the text a second time.
    # A response is final: the owner's row that holds one keeps every column when a
    # completion without one lands late, and answers false (see response_kept).
    kept = response_kept("$6")
    complete = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$3")} AS now)
UPDATE {t} AS r SET status = 'COMPLETED',
  expires_at = CASE WHEN {kept} THEN r.expires_at
    ELSE to_timestamp(ceil(n.now + greatest($4::float8, 0))) END,
  lease_ends_at = CASE WHEN {kept} THEN r.lease_ends_at END,
  validation = CASE WHEN {kept} THEN r.validation ELSE $5 END,
  response = CASE WHEN {kept} THEN r.response ELSE $6::text::jsonb END,
  not_stored = CASE WHEN {kept} THEN r.not_stored ELSE $7 END,
  steps = CASE WHEN {kept} THEN r.steps END,
  step_count = CASE WHEN {kept} THEN r.step_count END
FROM n WHERE r.key = $1 AND r.owner = $2
RETURNING {completion_wrote("$6")}"""
    # The owner's row carrying steps is released (no owner, its lease ended a millisecond
    # ago: $3, the manager's now, when it judges, else the server's clock), keeping its
    # steps, validation and expiry; the owner's row without is deleted.  The two are
    # exclusive (one row, ``steps`` NULL or not), each judged on the latest row version.
    # Gone counts as released, and so does a released row; a record another claim holds
    # is not.
    release = f"""WITH u AS (
  UPDATE {t} SET owner = NULL,
    lease_ends_at = coalesce(to_timestamp($3::float8), clock_timestamp())
      - interval '1 millisecond'
  WHERE key = $1 AND owner = $2 AND status = 'INPROGRESS' AND steps IS NOT NULL RETURNING 1
),
d AS (DELETE FROM {t} WHERE key = $1 AND owner = $2 AND steps IS NULL RETURNING 1)
SELECT EXISTS (SELECT 1 FROM u) OR EXISTS (SELECT 1 FROM d) OR NOT EXISTS (
  SELECT 1 FROM {t} WHERE key = $1
    AND NOT (owner IS NULL AND status = 'INPROGRESS' AND steps IS NOT NULL))"""
    # A recovery point: owner-fenced on the INPROGRESS row, applied when the row holds
    # $4 steps — or already holds exactly $5 (this write, sent again: rewritten as it is).
    # The expiry moves as a claim's would (ceil(now + ttl), never before the lease end)
    # and never backwards; the lease end does not move.
    record_step = f"""WITH n AS MATERIALIZED (SELECT {_NOW.format(param="$3")} AS now)
UPDATE {t} AS r SET steps = $5::text, step_count = $4::integer + 1,
  expires_at = greatest(r.expires_at, to_timestamp(ceil(greatest(
    n.now + $6::float8, extract(epoch FROM r.lease_ends_at)::float8))))
FROM n WHERE r.key = $1 AND r.owner = $2 AND r.status = 'INPROGRESS'
  AND (coalesce(r.step_count, 0) = $4::integer OR r.steps = $5::text)
RETURNING 1"""
    # Never backwards: the owner's row whose lease ends later already keeps every column
    # (judged on the latest row version, under the row lock) and answers false; no row is
    # a lost lease.
    extend = f"""WITH n AS MATERIALIZED (
  SELECT m.now, to_timestamp(m.now + $4::float8) AS lease_end
  FROM (SELECT {_NOW.format(param="$3")} AS now) AS m
)
UPDATE {t} AS r SET
  expires_at = CASE WHEN r.lease_ends_at > n.lease_end THEN r.expires_at
    ELSE to_timestamp(ceil(n.now + greatest($5::float8, $4::float8))) END,
  lease_ends_at = greatest(r.lease_ends_at, n.lease_end),
  validation = CASE WHEN r.lease_ends_at > n.lease_end THEN r.validation ELSE $6 END
FROM n WHERE r.key = $1 AND r.owner = $2 AND r.status = 'INPROGRESS'
RETURNING r.lease_ends_at = n.lease_end"""
    # An operator's release waits for a row an open transactional call holds at most
    # _OPERATOR_LOCK_WAIT (set before the DELETE can wait: it joins ``n``).
    force_release = f"""WITH n AS MATERIALIZED (
  SELECT set_config('lock_timeout', '{_OPERATOR_LOCK_WAIT}', true) AS lock_wait
)
DELETE FROM {t} AS r USING n WHERE r.key = $1 RETURNING {record}, {_STORED_KEY}"""
    # An operator's release of the record they were shown: only while the row is still that
    # record (owner, status, expiry and lease end as the store read them, and the whole step
    # list: one cut at the read bound, written by a worker allowed more, would let a step
    # recorded past the cut go unseen — such a row is never released this way).
    release_exactly = f"""WITH n AS MATERIALIZED (
  SELECT set_config('lock_timeout', '{_OPERATOR_LOCK_WAIT}', true) AS lock_wait
)
DELETE FROM {t} AS r USING n
WHERE r.key = $1 AND r.key::text = $1::text COLLATE "C"
  AND r.owner IS NOT DISTINCT FROM $2 AND r.status = $3
  AND ceil(extract(epoch FROM r.expires_at)::float8 - 1e-6::float8) = $4::float8
  AND extract(epoch FROM r.lease_ends_at)::float8 IS NOT DISTINCT FROM $5::float8
  AND r.steps IS NOT DISTINCT FROM $6::text
RETURNING 1"""
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
    page = f"""SELECT r.key, {record} FROM {t} AS r
WHERE r.key > $1 AND ($2::text IS NULL OR r.status = $2) ORDER BY r.key LIMIT $3"""
    return Statements(
        create,
        claim,
        get,
        complete,
        release,
        extend,
        force_release,
        release_exactly,
        vacuum,
        page,
        record_step,
    )


def lock_wait(seconds: float) -> str:
    """A claim's bound on waiting for a row lock, as a ``lock_timeout`` value: at least a
    millisecond (``0`` would mean no bound at all)."""
    return f"{max(1, min(int(seconds * 1000), 2_147_483_647))}ms"
