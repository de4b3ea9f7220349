"""The table's transactional parts (schema versions 2 and 3) and the statements that use them.

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

Version 3 adds the recovery points' columns (``steps``, ``step_count``: see
``_postgres_sql``), and a claim function of its own version that applies their rule as the
lease-mode claim does: it keeps the steps of a row it takes over (and answers with them,
``"claimed"``), drops an expired row's, and refuses a lapsed or released row carrying
another payload's steps (``"resumable"``, writing nothing).  An undo releases the row it
took over with steps (no owner, its lease ended) instead of deleting it.  It also holds the
*step function*: a transactional step's recovery point, written in the step's own
transaction (``record_step`` below), which raises :data:`STEP_LOST` when the owner's
in-progress row is absent, so that the step's own writes cannot commit without it.

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
    steps_ddl,
    steps_take,
    table_ddl,
)

__all__ = [
    "REFUSED_COMMIT",
    "SCHEMA_VERSION",
    "STEP_LOST",
    "TRIGGER",
    "Schema",
    "literal",
    "response_bound",
    "schema",
    "step_script",
    "undo",
]

SCHEMA_VERSION: Final = 3
REFUSED_COMMIT: Final = "IA001"
"""The SQLSTATE of a COMMIT the guard refused (an implementation-defined class: ``I``)."""
STEP_LOST: Final = "IA003"
"""The SQLSTATE the step function raises when the owner's INPROGRESS row is absent (the
lease was lost): the step's transaction aborts, its writes with it."""
TRIGGER: Final = "idempotency_async_unfinished"
_AGAIN: Final = "IA002"  # inside the claim function: undo a refused take-over's row lock
_UNFINISHED: Final = "idempotency_async.unfinished"
# What the claim function answers first: "claimed" (with the steps it kept), "read" (the
# row, not claimable), "resumable" (the row: another payload's steps), "mine" (a claim this
# transaction left unfinished), or the SQLSTATE of what it caught.
_ANSWER: Final = (
    "answer text, status text, owner text, expires float8, lease_end float8, "
    "validation text, response text, not_stored text, steps text, now float8, "
    "snapshot boolean, stored_key text"
)
# The key of the row an answer came from, last: a key column that compares other than byte
# for byte (citext, a nondeterministic collation) would find another key's row.
_NOTHING: Final = (
    "NULL::text, NULL::text, NULL::float8, NULL::float8, NULL::text, NULL::text, NULL::text, "
    "NULL::text"
)
_ROW: Final = (
    "r.status, r.owner, r.expires, r.lease_end, r.validation, r.response, r.not_stored, r.steps"
)


class Schema(NamedTuple):
    """A table's version-3 SQL: DDL, and the statements of transactional calls and steps."""

    create: tuple[str, ...]
    """Everything, for a new table (each statement idempotent)."""
    migrate: tuple[str, ...]
    """What versions 2 and 3 add to a table created before them (idempotent)."""
    check: str
    """Reads whether the table, the claim function and an enabled guard exist ($1: the
    table, $2: the claim function's signature, $3: the trigger's name)."""
    check_args: tuple[str, str, str]
    claim: str
    """$1 key, $2 owner (NULL: only read the row), $3 ttl, $4 validation, $5 lock_timeout
    (NULL: the caller's), $6 response read bound."""
    complete: str
    """$1 key, $2 owner, $3 ttl, $4 validation, $5 response text, $6 reason."""
    record_step: str
    """A transactional step's recovery point: $1 key, $2 owner, $3 now (NULL: the
    server's), $4 ttl, $5 position, $6 steps.  True when written; ``STEP_LOST`` raised when
    the owner's row is not in progress or holds another number of steps."""
    step_function: str
    """The step function's quoted name (for :func:`step_script`)."""
    table: str
    """The quoted table name."""


def _names(table: str) -> tuple[str, str, str, str, str]:
    """(claim function, guard function, qualified trigger name, schema prefix, step
    function), quoted."""
    digest = hashlib.sha1(table.encode()).hexdigest()[:10]
    schema_name, _, _ = table.rpartition(".")
    prefix = f'"{schema_name}".' if schema_name else ""
    version = f"v{SCHEMA_VERSION}"
    return (
        f'{prefix}"idempotency_async_{version}_claim_{digest}"',
        f'{prefix}"idempotency_async_{version}_guard_{digest}"',
        f'{prefix}"{TRIGGER}"',
        prefix,
        f'{prefix}"idempotency_async_{version}_step_{digest}"',
    )


def literal(text: str) -> str:
    """``text`` as an SQL string literal, whatever ``standard_conforming_strings`` says (for
    the few statements sent as text: the undo of a failed call)."""
    if "\x00" in text:
        raise ValueError("a text with NUL cannot be sent to PostgreSQL")
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def schema(table: str) -> Schema:
    """The version-3 SQL of ``table`` (a name :func:`quote_table` accepts)."""
    t = quote_table(table)
    claim_fn, guard_fn, trigger, _, step_fn = _names(table)
    unfinished = f"coalesce(current_setting('{_UNFINISHED}', true), '')"
    read = record_columns("t", "p_read_limit")
    refused, keep_steps = steps_take("t", "clock_timestamp()", "p_validation")
    take = ",\n          ".join(f"{column} = excluded.{column}" for column in COLUMNS[:-2])
    take += ",\n          " + keep_steps
    claimable_now = (
        "(t.expires_at < clock_timestamp() OR "
        f"(t.status = 'INPROGRESS' AND t.lease_ends_at < clock_timestamp())) AND NOT {refused}"
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
    kept text;
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
                RETURN QUERY SELECT 'read'::text, {_ROW}, n, snap, r.stored_key;
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
                RETURN QUERY SELECT 'read'::text, {_ROW}, n, snap, r.stored_key;
                RETURN;
            END IF;
            IF r.steps IS NOT NULL AND r.expires >= n AND r.status = 'INPROGRESS'
                    AND r.validation IS DISTINCT FROM p_validation THEN
                -- Another payload's recovery points: not taken over, nothing written.
                RETURN QUERY SELECT 'resumable'::text, {_ROW}, n, snap, r.stored_key;
                RETURN;
            END IF;
        END IF;
        IF p_wait IS NOT NULL THEN  -- the insert may wait for the row's lock
            PERFORM set_config('lock_timeout', p_wait, true);
        END IF;
        INSERT INTO {t} AS t (key, {", ".join(COLUMNS)})
        VALUES (p_key, 'INPROGRESS', p_owner, to_timestamp(ceil(n + p_ttl)), '-infinity',
                p_validation, NULL, NULL, NULL, NULL)
        ON CONFLICT (key) DO UPDATE SET
          {take}
        WHERE {claimable_now}
        RETURNING t.key::text, left(t.steps, p_read_limit) INTO taken, kept;
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
        RETURN QUERY SELECT 'claimed'::text, NULL::text, NULL::text, NULL::float8,
            NULL::float8, NULL::text, NULL::text, NULL::text, kept, n, snap, taken;
    EXCEPTION
        WHEN SQLSTATE '{_AGAIN}' THEN
            RETURN QUERY SELECT 'read'::text, {_ROW}, n, snap, r.stored_key;
        WHEN lock_not_available OR serialization_failure OR deadlock_detected
                OR query_canceled THEN
            RETURN QUERY SELECT SQLSTATE::text, NULL::text, NULL::text, NULL::float8,
                NULL::float8, NULL::text, NULL::text, left(SQLERRM, 300), NULL::text, n, snap,
                NULL::text;
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
    # A transactional step's recovery point, in the step's own transaction: the owner's
    # in-progress row holding p_position steps (or exactly p_steps already) takes the list;
    # anything else raises, so that the step's writes cannot commit without their recovery
    # point.  The expiry moves as in lease mode (``_postgres_sql``'s record_step).
    step_function = f"""CREATE OR REPLACE FUNCTION {step_fn}(
    p_key text, p_owner text, p_now float8, p_ttl float8, p_position integer, p_steps text
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $step$
DECLARE
    n float8 := coalesce(p_now, extract(epoch FROM clock_timestamp())::float8);
BEGIN
    UPDATE {t} AS r SET steps = p_steps, step_count = p_position + 1,
        expires_at = greatest(r.expires_at, to_timestamp(ceil(greatest(
            n + p_ttl, extract(epoch FROM r.lease_ends_at)::float8))))
    WHERE r.key = p_key AND r.owner = p_owner AND r.status = 'INPROGRESS'
        AND (coalesce(r.step_count, 0) = p_position OR r.steps = p_steps);
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = '{STEP_LOST}',
            MESSAGE = 'idempotency-async: the recovery point of a step of key '
                || left(p_key, {TOKEN_LIMIT}) || ' was not recorded: the call no longer '
                || 'holds the key at that step (its lease ended and another worker '
                || 'claimed it)',
            HINT = 'The step''s transaction cannot commit; roll it back.';
    END IF;
    RETURN true;
END
$step$"""
    comment = f"COMMENT ON TABLE {t} IS 'idempotency-async records, schema {SCHEMA_VERSION}'"
    migrate = (
        steps_ddl(table),
        guard_function,
        guard_trigger,
        claim_function,
        step_function,
        comment,
    )
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
    not_stored = CASE WHEN {kept} THEN r.not_stored ELSE $6 END,
    steps = CASE WHEN {kept} THEN r.steps END,
    step_count = CASE WHEN {kept} THEN r.step_count END
  WHERE r.key = $1 AND r.owner = $2
  RETURNING {completion_wrote("$5")} AS wrote
)
SELECT (SELECT wrote FROM u) AS written,
  set_config('{_UNFINISHED}', replace({unfinished}, ',' || $2 || ',', ','), true) AS unfinished"""
    record_step = f"SELECT {step_fn}($1, $2, $3::float8, $4::float8, $5::integer, $6::text)"
    return Schema(
        (*table_ddl(table), *migrate),
        migrate,
        check,
        (t, signature, TRIGGER),
        claim,
        complete,
        record_step,
        step_fn,
        t,
    )


def undo(table: str, savepoint: str | None, key: str, owner: str) -> str:
    """The text (one round trip, no parameters) that undoes a claimed call: its savepoint
    rolled back (the callback's writes), then its claim deleted — or, when it took over a
    row carrying steps, released with them (no owner, its lease ended) — and its owner
    dropped from the transaction's unfinished claims.  The claim was written before the
    savepoint, so its row lock stays until the caller's transaction ends."""
    rollback = (
        ""
        if savepoint is None
        else (f"ROLLBACK TO SAVEPOINT {savepoint}; RELEASE SAVEPOINT {savepoint}; ")
    )
    unfinished = f"coalesce(current_setting('{_UNFINISHED}', true), '')"
    mine = f"key = {literal(key)} AND owner = {literal(owner)} AND status = 'INPROGRESS'"
    return (
        f"{rollback}UPDATE {quote_table(table)} SET owner = NULL, "
        "lease_ends_at = clock_timestamp() - interval '1 millisecond' "
        f"WHERE {mine} AND steps IS NOT NULL; "
        f"DELETE FROM {quote_table(table)} WHERE {mine}; "
        f"SELECT set_config('{_UNFINISHED}', "
        f"replace({unfinished}, {literal(',' + owner + ',')}, ','), true)"
    )


def step_script(
    function: str, key: str, owner: str, now: float | None, ttl: float, position: int, steps: str
) -> str:
    """The text (no parameters: one round trip with the ``COMMIT``) that writes a
    transactional step's recovery point with the step ``function`` and commits.  When the
    function raises (the lease was lost), the ``COMMIT`` is not run: the transaction is
    left aborted, for the caller's ``ROLLBACK``."""
    when = "NULL" if now is None else literal(repr(float(now)))
    return (
        f"SELECT {function}({literal(key)}, {literal(owner)}, {when}::float8, "
        f"{literal(repr(float(ttl)))}::float8, {int(position)}::integer, "
        f"{literal(steps)}::text); COMMIT"
    )


def response_bound(max_response_bytes: int) -> int:
    """The claim function's ``p_read_limit`` for a store's ``max_response_bytes``."""
    return read_limit(max_response_bytes)
