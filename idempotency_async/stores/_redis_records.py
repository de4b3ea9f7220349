"""Record text of the Redis store: one JSON object per key, as the TypeScript port writes it
or, with ``record_format="powertools-python"``, as Powertools (Python) does: the same members,
but ``data`` holds the response as JSON text (a JSON string), which Powertools reads back
with ``json.loads``.

``{"status":…,"expiration":…,"in_progress_expiration":…,"validation":…,"owner":…,
"data_format":…,"data":…}`` — ``owner`` and ``data_format`` are ours (the TypeScript port
ignores them), and ``data`` comes last and holds the response as the manager encoded it,
spliced in byte for byte.  Reading splits the record at the first ``,"data":`` (see
:mod:`idempotency_async.stores._redis_scripts` for why that cut is sound), so the response
is decoded once, by the project's codec, with its exact Python types.
"""

from __future__ import annotations

import math
from typing import Any, Final

import orjson

from idempotency_async._json import MAX_STORED_DEPTH, StoredDataError, decode_stored, utf8_text
from idempotency_async.record import Completion, Record, Status
from idempotency_async.stores._record_formats import python_response, python_response_text

__all__ = ["FORMAT_NOT_STORED", "claim_tail", "completion_tail", "decode_record", "python_data"]

FORMAT_NOT_STORED: Final = "not-stored"
"""``data_format`` of a COMPLETED record without its response: ``not-stored: <why>``."""

_DATA: Final = b',"data":'
_MAX_STEPS: Final = 64
"""The most steps a record holds (the manager's own limit, ``steps.MAX_STEPS``)."""
_NEVER: Final = 2**63
_SPACE: Final = ord(" ")  # this library's wide integers follow one, for the stdlib decoder
_STATUSES: Final = {status.value: status for status in Status}
_COMPLETED: Final = Status.COMPLETED
_new_record: Final = tuple.__new__


def claim_tail(owner: str, validation: str | None) -> bytes:
    """What follows the instants in a claim's record text."""
    # One bytes formatting, not three concatenations: built on every claim.
    if validation is None:
        return b',"owner":%b}' % orjson.dumps(owner)
    return b',"validation":%b,"owner":%b}' % (orjson.dumps(validation), orjson.dumps(owner))


def python_data(encoded: bytes) -> bytes:
    """``data`` as Powertools (Python) stores it: the response's JSON text, as a JSON string."""
    return orjson.dumps(python_response_text(encoded))


def completion_tail(
    completion: Completion, encoded: bytes | None, reason: str | None, *, python: bool = False
) -> bytes:
    """What follows the expiry in a completion's record text (``encoded`` last, as is).

    ``python``: a response not stored still gets ``data``, the JSON text ``null``.
    Powertools (Python) 3.0 reads a missing ``data`` as the text ``None``, which fails
    to decode; ``null`` replays as ``None`` in every 3.x release.
    """
    owner, validation = orjson.dumps(completion.owner), completion.validation
    if validation is None:
        head = b',"owner":%b' % owner
    else:
        head = b',"validation":%b,"owner":%b' % (orjson.dumps(validation), owner)
    if encoded is not None:
        # Joined, not formatted: formatting copies a large response again as it grows.
        return b"".join((head, _DATA, encoded, b"}"))
    marker = FORMAT_NOT_STORED if not reason else f"{FORMAT_NOT_STORED}: {utf8_text(reason)}"
    return b'%b,"data_format":%b%b' % (
        head,
        orjson.dumps(marker),
        _DATA + b'"null"}' if python else b"}",
    )


def decode_record(
    key: str, raw: bytes, *, python: bool = False, max_steps_bytes: int = _NEVER
) -> Record:
    """The record in ``raw``, read as untrusted input (other writers share the server).

    Malformed control fields (the text is not a JSON object, or its status, instants,
    owner or validation are not what the layout says) raise ``ValueError``/``TypeError``/
    ``KeyError``/``StoredDataError``.  A malformed response — nested too deeply, a number
    that is not finite, not JSON text where Powertools (Python) keeps it — does not: the
    COMPLETED record comes back "not stored", with the reason.

    ``python``: ``data`` is JSON text (``record_format="powertools-python"``).
    ``max_steps_bytes``: the longest step list accepted (the store's ``max_response_bytes``);
    ``steps`` and ``step_count`` come together, on an INPROGRESS record only, as a string
    within the bound and a count from 1 to 64, or the record is unreadable (``ValueError``/
    ``TypeError``).
    """
    fields, data, data_error = _split(raw)
    status = fields["status"]
    try:
        status = _STATUSES[status]  # (the Enum's call costs more than the whole lookup)
    except (KeyError, TypeError):
        status = Status(status)  # raises, as it always has
    expiration = fields.get("expiration")
    lease_end = fields.get("in_progress_expiration")
    data_format = fields.get("data_format")
    not_stored = None
    if isinstance(data_format, str) and data_format.startswith(FORMAT_NOT_STORED):
        not_stored = data_format[len(FORMAT_NOT_STORED) :].lstrip(": ")
    response, stored = None, not_stored is None
    if status is _COMPLETED and stored and data is not _ABSENT:
        if data_error is None and not python:
            response = data
        else:
            response, not_stored = _response(data, data_error, python=python)
            stored = not_stored is None
    # The checks below run in the order they always have: a record malformed twice over
    # raises the same error.  An int within range is its own ceiling.
    if expiration is None:
        expiration = _NEVER  # the claim script never treats the record as expired
    elif type(expiration) is not int or not -_NEVER <= expiration <= _NEVER:
        expiration = _instant(expiration)
    if lease_end is not None:
        lease_end = _instant(lease_end) / 1000
    validation = fields.get("validation")
    if validation is not None and not isinstance(validation, str):
        raise _not_text("validation", validation)
    owner = fields.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise _not_text("owner", owner)
    steps = None
    if "steps" in fields or "step_count" in fields:
        steps = _steps(fields, status, max_steps_bytes)
    # Every field, in Record's order: tuple's constructor skips NamedTuple's Python __new__.
    return _new_record(
        Record,
        (
            key,
            status,
            expiration,
            lease_end,
            validation,
            owner,
            response,
            stored,
            not_stored or None,
            steps,
        ),
    )


def _steps(fields: dict[str, Any], status: Status, bound: int) -> str | None:
    """The record's step list (its JSON text, kept opaque: the manager reads its entries),
    checked as far as the store answers for it: its length, and the count beside it."""
    steps, count = fields.get("steps"), fields.get("step_count")
    if steps is None and count is None:
        return None
    if status is not Status.INPROGRESS:
        raise ValueError(f"a {status.value} record carries recovery points")
    if not isinstance(steps, str):
        raise TypeError(f"steps must be the step list's JSON text, got {type(steps).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_STEPS:
        raise ValueError(f"step_count must be an integer from 1 to {_MAX_STEPS}, got {count!r:.40}")
    if len(steps) > bound:
        raise ValueError(f"the step list is longer ({len(steps)} characters) than {bound}")
    # A count that disagrees with the list would make a resumed call's next write miss its
    # position (or land on another one): the list is read once here, bounded.
    listed = decode_stored(steps)
    if not isinstance(listed, list) or len(listed) != count:
        raise ValueError(f"step_count {count} does not count the step list")
    return steps


def _response(data: Any, error: Exception | None, *, python: bool) -> tuple[Any, str | None]:
    """(the response, None), or (None, why it cannot be read)."""
    if error is None and python and data is not None:
        try:
            if not isinstance(data, str):
                raise TypeError(f"data is {type(data).__name__}, not JSON text")
            # Powertools replays empty text as None.
            data = python_response(data) if data else None
        except (ValueError, TypeError) as exc:
            error = exc
    if error is not None:
        why = f"the stored response cannot be read: {type(error).__name__}: {error}"
        return None, why[:300]
    return data, None


_ABSENT: Final = object()


def _split(raw: bytes) -> tuple[dict[str, Any], Any, Exception | None]:
    """(the members but ``data``, the decoded ``data`` or ``_ABSENT``, why ``data`` could
    not be decoded)."""
    cut = raw.find(_DATA)
    # The common record (a replay reads one): "data" last, neither part marked for the
    # stdlib's wide integers, and too short to open more than MAX_STORED_DEPTH brackets (one
    # byte each).  orjson reads both parts as the bounded reading below would.
    if (
        cut > 0
        and len(raw) <= MAX_STORED_DEPTH
        and raw[-1:] == b"}"
        and raw[0] != _SPACE
        and raw[cut + len(_DATA)] != _SPACE
    ):
        try:
            members = orjson.loads(raw[:cut] + b"}")
            data = orjson.loads(raw[cut + len(_DATA) : -1])
        except orjson.JSONDecodeError:
            pass  # below, as any other record
        else:
            if type(members) is dict and "status" in members:
                return members, data, None
    fields: Any = None
    data_error: StoredDataError | None = None
    if cut >= 0 and raw.endswith(b"}"):
        # Neither part nests deeper than the whole record opens brackets: within the bound,
        # decode_stored's own check of each part is skipped (a replay reads a record).
        bounded = raw.count(b"[") + raw.count(b"{") <= MAX_STORED_DEPTH
        decode = _decode_bounded if bounded else decode_stored
        # Unreadable when "data" is not the last member: the whole record decides below.
        try:
            fields = decode(raw[:cut] + b"}")
        except StoredDataError:
            fields = None  # (cheaper than contextlib.suppress on a replay's path)
        if isinstance(fields, dict) and "status" in fields:
            try:
                return fields, decode(raw[cut + len(_DATA) : -1]), None
            except StoredDataError as exc:
                data_error = exc  # or other members follow "data": the whole record decides
    try:
        # Exact: the standard library keeps integers of any size.
        whole = decode_stored(raw, exact=True)
    except StoredDataError:
        if data_error is None:
            raise
        return fields, None, data_error  # the members are readable, only "data" is not
    if not isinstance(whole, dict):
        raise TypeError(f"a record is a JSON object, not {type(whole).__name__}")
    return whole, whole.get("data", _ABSENT), None


def _decode_bounded(text: bytes) -> Any:
    """``decode_stored(text)`` for text known to nest within ``MAX_STORED_DEPTH`` levels:
    orjson's answer as it is when it reads the text, ``decode_stored`` otherwise."""
    if text[:1] != b" ":  # a leading space: this library's wide integers, for the stdlib
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return decode_stored(text)


def _instant(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}"[:100])
    if not -_NEVER <= value <= _NEVER:  # finite: decode_stored refuses 1e999
        raise ValueError(f"the instant {value!r} is not a Unix time"[:100])
    return math.ceil(value)


def _not_text(name: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be a string, got {type(value).__name__}")
