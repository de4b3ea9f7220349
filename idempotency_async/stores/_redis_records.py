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

import json
import math
from typing import Any, Final

import orjson

from idempotency_async._codec import decode_json
from idempotency_async.record import Completion, Record, Status
from idempotency_async.stores._record_formats import python_response, python_response_text

__all__ = ["FORMAT_NOT_STORED", "claim_tail", "completion_tail", "decode_record", "python_data"]

FORMAT_NOT_STORED: Final = "not-stored"
"""``data_format`` of a COMPLETED record without its response: ``not-stored: <why>``."""

_DATA: Final = b',"data":'
_NEVER: Final = 2**63


def claim_tail(owner: str, validation: str | None) -> bytes:
    """What follows the instants in a claim's record text."""
    parts = [b',"validation":' + orjson.dumps(validation)] if validation is not None else []
    parts.append(b',"owner":' + orjson.dumps(owner) + b"}")
    return b"".join(parts)


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
    parts = []
    if completion.validation is not None:
        parts.append(b',"validation":' + orjson.dumps(completion.validation))
    parts.append(b',"owner":' + orjson.dumps(completion.owner))
    if encoded is None:
        marker = FORMAT_NOT_STORED if not reason else f"{FORMAT_NOT_STORED}: {reason}"
        parts.append(b',"data_format":' + orjson.dumps(marker))
        parts.append(_DATA + b'"null"}' if python else b"}")
    else:
        parts += (_DATA, encoded, b"}")
    return b"".join(parts)


def decode_record(key: str, raw: bytes, *, python: bool = False) -> Record:
    """The record in ``raw``; ``ValueError``/``TypeError``/``KeyError`` when unreadable.

    ``python``: ``data`` is JSON text (``record_format="powertools-python"``).
    """
    fields, data, has_data = _split(raw)
    if python and has_data and data is not None:
        if not isinstance(data, str):
            raise TypeError(f"data must be JSON text in a Powertools (Python) record, got {data!r}")
        # Powertools replays empty text as None.
        data = python_response(data) if data else None
    data_format = fields.get("data_format")
    not_stored = None
    if isinstance(data_format, str) and data_format.startswith(FORMAT_NOT_STORED):
        not_stored = data_format[len(FORMAT_NOT_STORED) :].lstrip(": ")
    expiration = fields.get("expiration")
    lease_end = fields.get("in_progress_expiration")
    owner = fields.get("owner")
    validation = fields.get("validation")
    return Record(
        key=key,
        status=Status(fields["status"]),
        # No expiration: the claim script never treats the record as expired.
        expiration=_NEVER if expiration is None else math.ceil(_number(expiration)),
        lease_end=None if lease_end is None else math.ceil(_number(lease_end)) / 1000,
        validation=validation if isinstance(validation, str) else None,
        owner=owner if isinstance(owner, str) else None,
        response=data if has_data else None,
        response_stored=not_stored is None,
        not_stored=not_stored or None,
    )


def _split(raw: bytes) -> tuple[dict[str, Any], Any, bool]:
    """(the members but ``data``, the decoded ``data``, whether there was one)."""
    cut = raw.find(_DATA)
    if cut >= 0 and raw.endswith(b"}"):
        try:
            fields = orjson.loads(raw[:cut] + b"}")
            data = decode_json(raw[cut + len(_DATA) : -1])
        except ValueError:
            pass  # "data" is not the last member: decode the whole record below
        else:
            if isinstance(fields, dict) and "status" in fields:
                return fields, data, True
    # The standard library keeps integers of any size exact.
    fields = json.loads(raw)
    if not isinstance(fields, dict):
        raise TypeError(f"a record is a JSON object, not {type(fields).__name__}")
    return fields, fields.get("data"), "data" in fields


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return value
