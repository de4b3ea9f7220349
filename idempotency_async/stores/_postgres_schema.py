"""The table's transactional parts (schema version 2) and the statements that use them.

A transactional call (``Manager.execute_in_transaction``) writes its claim in the caller's
transaction, where only the database can stop the caller from committing it unfinished
(a handled timeout, a callback that commits or raises).  Version 2 of the table adds:

- a **guard**: a deferred constraint trigger on rows a transactional claim writes (status
  ``INPROGRESS``, lease ``-infinity``: "ended from the start", the row lock is the lease).
  At COMMIT it reads the key's row again and refuses the COMMIT, with SQLSTATE
  :data:`REFUSED_COMMIT`, if the claim is still in progress.  A row such a claim left
  committed some other way (the trigger disabled) is claimable at once: its lease ended.
- a **claim function**: the transactional claim as one prepared call, so that a replay is
  one round trip and a first call needs no savepoint before its claim.  It reads the key's
  row first and answers from it when it is not claimable (no write, no lock); otherwise it
  inserts (or takes over) the row.  Its work runs in a subtransaction of its own (an
  ``EXCEPTION`` block): a lock timeout, a serialization failure, a deadlock or a
  cancellation rolls back only that, and comes back as an answer, never as an error that
  would abort the caller's transaction.  Its ``lock_timeout`` (the call's wait) bounds
  every lock it waits for — the key's row, and the table itself (a migration's lock).

The claim also re-defers the guard (a caller's ``SET CONSTRAINTS ALL IMMEDIATE`` would
otherwise refuse the claim itself) and notes its owner in a transaction-local setting
(``idempotency_async.unfinished``) until the call completes or is undone, so a later call
of the same transaction meeting a row this transaction left unfinished refuses instead of
taking it over (see docs/postgres.md).  Everything is transaction-local: no session state.

The names of the functions carry the schema version and a digest of the table name;
:data:`SCHEMA_VERSION` says which version the library needs.
"""

from __future__ import annotations

import hashlib
from typing import Final, NamedTuple

from idempotency_async.stores._postgres_sql import (
    COLUMNS,
    TOKEN_LIMIT,
    completion_wrote,
    quote_table,
    read_limit,
    record_columns,
    response_kept,
    table_ddl,
)

__all__ = [
    "REFUSED_COMMIT",
    "SCHEMA_VERSION",
    "TRIGGER",
    "Schema",
    "literal",
    "response_bound",
    "schema",
    "undo",
]

SCHEMA_VERSION: Final = 2
REFUSED_COMMIT: Final = "IA001"
"""The SQLSTATE of a COMMIT the guard refused (an implementation-defined class: ``I``)."""
TRIGGER: Final = "idempotency_async_unfinished"
_AGAIN: Final = "IA002"  # inside the claim function: undo a refused take-over's row lock
_UNFINISHED: Final = "idempotency_async.unfinished"
# What the claim function answers first: "claimed", "read" (the row, not claimable), "mine"
# (a claim this transaction left unfinished), or the SQLSTATE of what it caught.
_ANSWER: Final = (
    "answer text, status text, owner text, expires float8, lease_end float8, "
    "validation text, response text, not_stored text, now float8, snapshot boolean, "
    "stored_key text"
)
# The key of the row an answer came from, last: a key column that compares other than byte
# for byte (citext, a nondeterministic collation) would find another key's row.
_NOTHING: Final = (
    "NULL::text, NULL::text, NULL::float8, NULL::float8, NULL::text, NULL::text, NULL::text"
)


class Schema(NamedTuple):
    """A table's version-2 SQL: DDL, and the statements of transactional calls."""

    create: tuple[str, ...]
    """Everything, for a new table (each statement idempotent)."""
    migrate: tuple[str, ...]
    """What version 2 adds to a table created before it (idempotent)."""
    check: str
    """Reads whether the table, the claim function and an enabled guard exist ($1: the
    table, $2: the claim function's signature, $3: the trigger's name)."""
    check_args: tuple[str, str, str]
    claim: str
    """$1 key, $2 owner (NULL: only read the row), $3 ttl, $4 validation, $5 lock_timeout
    (NULL: the caller's), $6 response read bound."""
    complete: str
    """$1 key, $2 owner, $3 ttl, $4 validation, $5 response text, $6 reason."""
    table: str
    """The quoted table name."""


def _names(table: str) -> tuple[str, str, str, str]:
    """(claim function, guard function, qualified trigger name, schema prefix), quoted."""
    digest = hashlib.sha1(table.encode()).hexdigest()[:10]
    schema_name, _, _ = table.rpartition(".")
    prefix = f'"{schema_name}".' if schema_name else ""
    version = f"v{SCHEMA_VERSION}"
    return (
        f'{prefix}"idempotency_async_{version}_claim_{digest}"',
        f'{prefix}"idempotency_async_{version}_guard_{digest}"',
        f'{prefix}"{TRIGGER}"',
        prefix,
    )


def literal(text: str) -> str:
    """``text`` as an SQL string literal, whatever ``standard_conforming_strings`` says (for
    the few statements sent as text: the undo of a failed call)."""
    if "\x00" in text:
        raise ValueError("a text with NUL cannot be sent to PostgreSQL")
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def schema(table: str) -> Schema:
    """The version-2 SQL of ``table`` (a name :func:`quote_table` accepts)."""
    t = quote_table(table)
    claim_fn, guard_fn, trigger, _ = _names(table)
    unfinished = f"coalesce(current_setting('{_UNFINISHED}', true), '')"
    read = record_columns("t", "p_read_limit")
    take = ",\n          ".join(f"{column} = excluded.{column}" for column in COLUMNS)
    claimable_now = (
        "t.expires_at < clock_timestamp() OR "
        "(t.status = 'INPROGRESS' AND t.lease_ends_at < clock_timestamp())"
    )
    claim_function = f"""CREATE OR REPLACE FUNCTION {claim_fn}(
    p_key text, p_owner text, p_ttl float8, p_validation text, p_wait text, p_read_limit integer
) RETURNS TABLE ({_ANSWER})
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    caller_wait text := current_setting('lock_timeout');
    mine text := {unfinished};
    n float8 := extract(epoch FROM clock_timestamp())::float8;
    snap boolean := current_setting('transaction_isolation') <> 'read committed';
    got boolean;
    taken text;
    r record;
BEGIN
    BEGIN
        IF p_wait IS NOT NULL THEN
            PERFORM set_config('lock_timeout', p_wait, true);
        END IF;
        SELECT {read}, t.key::text AS stored_key INTO r FROM {t} AS t WHERE t.key = p_key;
        got := FOUND;
        PERFORM set_config('lock_timeout', caller_wait, true);  -- (its own again)
        IF p_owner IS NULL THEN  -- a read (a duplicate polling a lease-mode holder)
            IF NOT got THEN
                RETURN QUERY SELECT 'read'::text, {_NOTHING}, n, snap, NULL::text;
            ELSE
                RETURN QUERY SELECT 'read'::text, r.status, r.owner, r.expires, r.lease_end,
                    r.validation, r.response, r.not_stored, n, snap, r.stored_key;
            END IF;
            RETURN;
        END IF;
        SET CONSTRAINTS {trigger} DEFERRED;
        IF got THEN
            IF r.status = 'INPROGRESS' AND r.lease_end = '-Infinity'::float8
                    AND position(',' || r.owner || ',' IN mine) > 0 THEN
                RETURN QUERY SELECT 'mine'::text, {_NOTHING}, n, snap, NULL::text;
                RETURN;
            END IF;
            IF NOT (r.expires < n OR (r.status = 'INPROGRESS' AND r.lease_end < n)) THEN
                RETURN QUERY SELECT 'read'::text, r.status, r.owner, r.expires, r.lease_end,
                    r.validation, r.response, r.not_stored, n, snap, r.stored_key;
                RETURN;
            END IF;
        END IF;
        IF p_wait IS NOT NULL THEN  -- the insert may wait for the row's lock
            PERFORM set_config('lock_timeout', p_wait, true);
        END IF;
        INSERT INTO {t} AS t (key, {", ".join(COLUMNS)})
        VALUES (p_key, 'INPROGRESS', p_owner, to_timestamp(ceil(n + p_ttl)), '-infinity',
                p_validation, NULL, NULL)
        ON CONFLICT (key) DO UPDATE SET
          {take}
        WHERE {claimable_now}
        RETURNING t.key::text INTO taken;
        IF NOT FOUND THEN
            -- The row changed while this waited for its lock (committed by another
            -- transaction) and may not be taken: answer with it, as READ COMMITTED now
            -- sees it, and undo the lock the refused update holds.
            SELECT {read}, t.key::text AS stored_key INTO r FROM {t} AS t WHERE t.key = p_key;
            RAISE SQLSTATE '{_AGAIN}';
        END IF;
        PERFORM set_config('lock_timeout', caller_wait, true);
        PERFORM set_config('{_UNFINISHED}',
            CASE WHEN mine = '' THEN ',' ELSE mine END || p_owner || ',', true);
        RETURN QUERY SELECT 'claimed'::text, {_NOTHING}, n, snap, taken;
    EXCEPTION
        WHEN SQLSTATE '{_AGAIN}' THEN
            RETURN QUERY SELECT 'read'::text, r.status, r.owner, r.expires, r.lease_end,
                r.validation, r.response, r.not_stored, n, snap, r.stored_key;
        WHEN lock_not_available OR serialization_failure OR deadlock_detected
                OR query_canceled THEN
            RETURN QUERY SELECT SQLSTATE::text, NULL::text, NULL::text, NULL::float8,
                NULL::float8, NULL::text, NULL::text, left(SQLERRM, 300), n, snap, NULL::text;
    END;
END
$claim$"""
    guard_function = f"""CREATE OR REPLACE FUNCTION {guard_fn}() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF EXISTS (SELECT 1 FROM {t} AS r WHERE r.key = NEW.key AND r.status = 'INPROGRESS'
               AND r.lease_ends_at = '-infinity') THEN
        RAISE EXCEPTION USING
            ERRCODE = '{REFUSED_COMMIT}',
            MESSAGE = 'idempotency-async: this transaction holds an unfinished '
                || 'transactional claim of key ' || left(NEW.key, {TOKEN_LIMIT})
                || ', so it cannot commit',
            HINT = 'A call of execute_in_transaction did not finish (it was cancelled or '
                || 'timed out, or its callback committed): roll the transaction back '
                || 'and run it again.';
    END IF;
    RETURN NULL;
END
$guard$"""
    guard_trigger = f"""DO $trigger$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                   WHERE tgrelid = {literal(t)}::regclass AND tgname = '{TRIGGER}') THEN
        CREATE CONSTRAINT TRIGGER {TRIGGER} AFTER INSERT OR UPDATE ON {t}
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
            WHEN (NEW.status = 'INPROGRESS' AND NEW.lease_ends_at = '-infinity')
            EXECUTE FUNCTION {guard_fn}();
    END IF;
END
$trigger$"""
    comment = f"COMMENT ON TABLE {t} IS 'idempotency-async records, schema {SCHEMA_VERSION}'"
    migrate = (guard_function, guard_trigger, claim_function, comment)
    check = """SELECT to_regclass($1) IS NOT NULL AS table_exists,
       to_regprocedure($2) IS NOT NULL AS claims,
       EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS g
               WHERE g.tgrelid = to_regclass($1) AND g.tgname = $3
                 AND g.tgenabled <> 'D') AS guarded"""
    signature = f"{claim_fn}(text, text, float8, text, text, integer)"
    claim = f"SELECT * FROM {claim_fn}($1, $2, $3::float8, $4, $5, $6::integer)"
    # The completion also drops its owner from the transaction's unfinished claims.  A
    # response is final, as in lease mode (see response_kept): written is NULL when the
    # row is not the owner's, false when the owner's response was kept.
    kept = response_kept("$5")
    complete = f"""WITH u AS (
  UPDATE {t} AS r SET status = 'COMPLETED',
    expires_at = CASE WHEN {kept} THEN r.expires_at ELSE to_timestamp(
      ceil(extract(epoch FROM clock_timestamp()) + greatest($3::float8, 0))) END,
    lease_ends_at = CASE WHEN {kept} THEN r.lease_ends_at END,
    validation = CASE WHEN {kept} THEN r.validation ELSE $4 END,
    response = CASE WHEN {kept} THEN r.response ELSE $5::text::jsonb END,
    not_stored = CASE WHEN {kept} THEN r.not_stored ELSE $6 END
  WHERE r.key = $1 AND r.owner = $2
  RETURNING {completion_wrote("$5")} AS wrote
)
SELECT (SELECT wrote FROM u) AS written,
  set_config('{_UNFINISHED}', replace({unfinished}, ',' || $2 || ',', ','), true) AS unfinished"""
    return Schema(
        (*table_ddl(table), *migrate),
        migrate,
        check,
        (t, signature, TRIGGER),
        claim,
        complete,
        t,
    )


def undo(table: str, savepoint: str | None, key: str, owner: str) -> str:
    """The text (one round trip, no parameters) that undoes a claimed call: its savepoint
    rolled back (the callback's writes), then its claim deleted and its owner dropped
    from the transaction's unfinished claims.  The claim was written before the savepoint,
    so its row lock stays until the caller's transaction ends."""
    rollback = (
        ""
        if savepoint is None
        else (f"ROLLBACK TO SAVEPOINT {savepoint}; RELEASE SAVEPOINT {savepoint}; ")
    )
    unfinished = f"coalesce(current_setting('{_UNFINISHED}', true), '')"
    return (
        f"{rollback}DELETE FROM {quote_table(table)} WHERE key = {literal(key)} "
        f"AND owner = {literal(owner)} AND status = 'INPROGRESS'; "
        f"SELECT set_config('{_UNFINISHED}', "
        f"replace({unfinished}, {literal(',' + owner + ',')}, ','), true)"
    )


def response_bound(max_response_bytes: int) -> int:
    """The claim function's ``p_read_limit`` for a store's ``max_response_bytes``."""
    return read_limit(max_response_bytes)
