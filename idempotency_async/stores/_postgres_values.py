"""Responses as ``jsonb``, exactly, and rows read back as untrusted input.

``jsonb`` keeps numbers as ``numeric``: integers of any size are exact.  But ``numeric``
prints without an exponent and with the scale it was given, so ``1e300`` would come back
as a 301-digit *integer*.  Numbers written with an exponent are therefore rewritten in
plain decimal with a fractional part (``1e300`` → ``1000…0.0``, ``1.5e-10`` →
``0.00000000015``): the same value, which reads back as the same float.

``jsonb`` cannot hold ``\\u0000`` nor a lone surrogate: such a response completes as not
stored, with the reason.  Object members come back in ``jsonb``'s order (shorter keys
first), equal as dicts.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any, Final

import orjson

from idempotency_async._json import nesting_depth
from idempotency_async.canonical import MAX_DEPTH
from idempotency_async.errors import InconsistentStateError, StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores._postgres_sql import TOKEN_LIMIT, read_limit
from idempotency_async.stores.base import CLAIMED, Found, Verdict

__all__ = [
    "check_key",
    "claim_verdict",
    "completion_text",
    "decode_response",
    "jsonb_text",
    "record_from_row",
    "text_column",
]

_EXPONENT_HINT: Final = re.compile(rb"\d[eE]")
# A JSON string (skipped as is) or a number with an exponent (rewritten).
_STRING_OR_EXPONENT: Final = re.compile(
    rb'"(?:[^"\\]|\\.)*"|(-?(?:0|[1-9]\d*)(?:\.\d+)?[eE][+-]?\d+)', re.DOTALL
)
# \u0000 after an even number of backslashes is the escape itself, not an escaped backslash.
_NUL: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_LONG_NUMBER: Final = re.compile(r"\d{19}")
_WRITE_FACTOR: Final = 2


def claim_verdict(claim: Claim, row: Any, limit: int) -> Verdict:
    """The verdict of the claim statement's answer ``row`` (the record that answered it
    and the server's ``now``).

    The claim's own row answers :data:`CLAIMED` — or, when it kept recovery points,
    ``Verdict(Found.CLAIMED, record)`` with them.  Another's row that is in progress, whose
    lease ended and that carries steps, answers ``RESUMABLE``: the statement refused it
    (another payload's progress), as a claimable row is otherwise taken."""
    if row is None or len(row) != 10:
        raise StoreUnavailableError(
            f"the server answered a claim of key {claim.key!r} with {row!r:.200}, which is not "
            "the store's statement answer; the callback was not run"
        )
    check_key(claim.key, row[-1])
    if row[0] == "INPROGRESS" and row[1] == claim.owner:
        if row[7] is None:
            return CLAIMED
        return Verdict(Found.CLAIMED, record_from_row(claim.key, row, limit))
    record = record_from_row(claim.key, row, limit)
    now = row[8]
    if record.status is Status.COMPLETED:
        return Verdict(Found.COMPLETED, record, None, record.expiration - now)
    end = record.lease_end
    if end is None:
        end = record.expiration
    elif record.steps is not None and end < now and record.validation != claim.validation:
        return Verdict(Found.RESUMABLE, record)
    return Verdict(Found.IN_PROGRESS, record, max(end - now, 0.0))


def check_key(key: str, stored: Any) -> None:
    """Refuse an answer from another key's row (``stored``: the row's key, last in every
    answer about one key; None when there is no row)."""
    if stored is not None and stored != key:
        raise InconsistentStateError(
            f"the store asked about key {key!r} and the table answered with the row of key "
            f"{str(stored)[:200]!r}: its key column compares keys other than byte for byte "
            "(citext, a nondeterministic collation, char(n)?) or a proxy mixed answers up. "
            "It was not used; the key column must be text with a deterministic collation"
        )


def completion_text(completion: Completion, limit: int) -> tuple[str | None, str | None]:
    """(the response as ``jsonb`` text, or None; why it is not stored, or None)."""
    encoded, reason = completion.encoded, completion.not_stored
    if encoded is None:
        return None, reason
    if len(encoded) > limit:
        return None, f"larger than max_response_bytes ({len(encoded)} bytes of JSON)"
    return jsonb_text(encoded, limit)


def text_column(reason: str | None) -> str | None:
    """A reason a ``text`` column holds: Postgres refuses NUL, and a lone surrogate cannot
    be sent as UTF-8 (a reason may quote the result that could not be stored)."""
    if reason is None:
        return None
    return reason.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def jsonb_text(encoded: bytes, limit: int) -> tuple[str | None, str | None]:
    """(the text to store as ``jsonb``, or None and why not)."""
    # ``find``, not ``in``: ``in`` first tries its operand as an integer (an exception
    # raised and cleared in C), twice the cost on every completion.
    if encoded.find(b"\\u0000") != -1 and _NUL.search(encoded):
        return None, "not storable as jsonb (the response holds \\u0000)"
    if _EXPONENT_HINT.search(encoded):
        encoded = _STRING_OR_EXPONENT.sub(_plain, encoded)
        if len(encoded) > _WRITE_FACTOR * limit:
            return None, (
                f"too large as jsonb ({len(encoded)} bytes with its numbers written out in "
                f"plain decimal, over {_WRITE_FACTOR} x max_response_bytes)"
            )
    try:
        return encoded.decode(), None
    except UnicodeDecodeError:
        return None, "not storable as jsonb (the response is not valid UTF-8)"


def _plain(match: re.Match[bytes]) -> bytes:
    number = match.group(1)
    if number is None:
        return match.group(0)
    text = format(Decimal(number.decode()), "f")
    return (text if "." in text else text + ".0").encode()


def decode_response(text: str, limit: int) -> tuple[Any, str | None]:
    """(the response, None) or (None, why it cannot be read) for ``jsonb`` text."""
    if len(text) >= read_limit(limit):
        # (The statement cut it there: the server never sends more.)
        return None, "unreadable: larger than the store reads back (4 x max_response_bytes)"
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:
        return None, f"unreadable: nested deeper than {MAX_DEPTH} levels"
    try:
        if _LONG_NUMBER.search(text) is None:
            return orjson.loads(text), None
        # orjson reads integers beyond 64 bits as floats; the standard library keeps them.
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, f"unreadable: {exc}"[:300]
    if not _finite(value):
        return None, "unreadable: a number beyond the float range"
    return value, None


def _finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def record_from_row(key: str, row: Any, limit: int) -> Record:
    """The record in a statement's answer (``_postgres_sql.record_columns``).

    Control fields that do not make sense raise ``InconsistentStateError``; a response that
    cannot be read makes a completed record "not stored", with the reason.  The step list
    is kept as its text (the manager reads it, and refuses one it cannot).
    """
    status, owner, expires, lease_end, validation, response, not_stored, steps = row[:8]
    try:
        state = Status(status)
        if not isinstance(expires, float) or not math.isfinite(expires):
            raise ValueError(f"expires_at is {expires!r}")
        # -infinity: a transactional claim's lease, ended from the start (its row lock is
        # its lease), so such a row committed some other way is claimable at once.
        if lease_end is not None and (math.isnan(lease_end) or lease_end == math.inf):
            raise ValueError(f"lease_ends_at is {lease_end!r}")
        if steps is not None and not isinstance(steps, str):
            raise ValueError(f"steps is {type(steps).__name__}, not text")
        for name, token in (("owner", owner), ("validation", validation)):
            if token is not None and len(token) > TOKEN_LIMIT:
                raise ValueError(f"its {name} is longer than {TOKEN_LIMIT} characters")
    except ValueError as exc:
        raise InconsistentStateError(
            f"the record of key {key!r} cannot be judged ({exc}): it was not written by this "
            "library; delete it with `idempotency-async delete` or force_release"
        ) from exc
    value, unreadable = None, None
    if response is not None:
        value, unreadable = decode_response(response, limit)
    stored = state is Status.INPROGRESS or (response is not None and unreadable is None)
    return Record(
        key=key,
        status=state,
        expiration=math.ceil(expires - 1e-6),
        lease_end=lease_end,
        validation=validation,
        owner=owner,
        response=value,
        response_stored=stored,
        not_stored=unreadable or not_stored,
        steps=steps if state is Status.INPROGRESS else None,
    )
